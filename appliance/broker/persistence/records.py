"""What ``broker.db`` holds, as the broker hands it over and gets it back: one frozen record per row
kind, and the property blob.

Publish properties (MQTT 5) are stored as one blob, ``properties_to_blob``: UTF-8 JSON of an object whose
keys are property names chosen by the caller and whose values are int, str, bytes (written as
``{"b64": "..."}``) or lists (user properties: lists of ``[key, value]`` pairs, read back as tuples). It
is self-describing, readable with the ``sqlite3`` shell, and never unpickles anything.

Times are wall-clock UNIX seconds, because they must survive a restart.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from appliance.broker.routing.topic_tree import SubscriptionOptions

PropertyValue = int | str | bytes | Sequence[tuple[str, str]] | Sequence[int]


class OutboundState(IntEnum):
    """Where an outbound QoS 1/2 delivery stands."""

    QUEUED = 0  # not sent yet (or sent and not recorded): send with a new packet id
    PUBLISH_SENT = 1  # PUBLISH sent with ``packet_id``; resend with DUP after reconnect
    PUBREL_SENT = 2  # QoS 2: PUBREC received, PUBREL sent; resend PUBREL after reconnect


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A QoS 1/2 message: in its queue entry when queued for one session, else stored once (``messages``)
    however many sessions it is queued for."""

    topic: str
    payload: bytes
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    expires_at: float | None = None  # from the message expiry interval; None: never


@dataclass(frozen=True, slots=True)
class StoredDelivery:
    """One entry of a session's outbound queue; ``qos``/``retain`` are as delivered to this session.
    ``message_id`` is None when the message is stored in the entry itself (queued for this session only);
    ``load`` then hands it over as ``body``."""

    seq: int
    client_id: str
    message_id: int | None
    qos: int
    retain: bool = False
    subscription_ids: tuple[int, ...] = ()
    packet_id: int | None = None
    state: OutboundState = OutboundState.QUEUED
    body: StoredMessage | None = None


@dataclass(frozen=True, slots=True)
class StoredWill:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    delay_interval: int = 0


@dataclass(frozen=True, slots=True)
class StoredSession:
    """A durable session. ``disconnected_at`` is None while connected: after a crash such a session's
    client did not disconnect normally, so its will is due and its expiry counts from the restart.
    Once disconnected, ``will`` is set only while the will waits out its Will Delay Interval (it is
    cleared when published), so a restart can publish it at ``disconnected_at`` + the delay."""

    client_id: str
    protocol_level: int  # 4 = MQTT 3.1.1, 5 = MQTT 5
    expiry_interval: int  # seconds; 0xFFFFFFFF never expires
    username: str | None = None
    disconnected_at: float | None = None
    will: StoredWill | None = None


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    topic: str
    payload: bytes
    qos: int
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    expires_at: float | None = None


@dataclass(slots=True)
class LoadedSession:
    """A session with everything hanging off it, as ``load`` returns it."""

    session: StoredSession
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)  # by topic filter as sent
    outbound: list[StoredDelivery] = field(default_factory=list)  # in flight (sent), in sequence order
    queued: int = 0  # deliveries never sent: left in the store, read back with ``BrokerStore.page``
    stored_bytes: int = 0  # payload bytes of all its deliveries, sent or not (``max_queued_bytes``)
    inbound_qos2: set[int] = field(default_factory=set)  # packet ids awaiting PUBREL


@dataclass(slots=True)
class BrokerState:
    """Everything needed to rebuild the broker after a restart."""

    sessions: dict[str, LoadedSession]
    messages: dict[int, StoredMessage]  # every shared message (``messages``) some in-flight entry refers to
    retained: dict[str, RetainedMessage]


def properties_to_blob(properties: Mapping[str, PropertyValue]) -> bytes | None:
    """The blob for a property mapping (None when empty); TypeError for an unsupported value."""
    if not properties:
        return None
    encoded: dict[str, object] = {}
    for name, value in properties.items():
        if isinstance(value, bytes):
            encoded[name] = {"b64": base64.b64encode(value).decode("ascii")}
        elif isinstance(value, bool) or not isinstance(value, (int, str, list, tuple)):
            raise TypeError(f"property {name!r}: cannot store a {type(value).__name__}")
        elif isinstance(value, (list, tuple)):
            encoded[name] = [_encode_item(name, item) for item in value]
        else:
            encoded[name] = value
    return json.dumps(encoded, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _encode_item(name: str, item: object) -> object:
    if isinstance(item, int) and not isinstance(item, bool):
        return item
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(part, str) for part in item):
        return [item[0], item[1]]
    raise TypeError(f"property {name!r}: list items must be ints or (str, str) pairs, got {item!r}")


def properties_from_blob(blob: bytes | None) -> dict[str, PropertyValue]:
    """The inverse of ``properties_to_blob``."""
    if blob is None:
        return {}
    decoded: dict[str, PropertyValue] = {}
    for name, value in json.loads(blob).items():
        if isinstance(value, dict):
            decoded[name] = base64.b64decode(value["b64"])
        elif isinstance(value, list):
            decoded[name] = [tuple(item) if isinstance(item, list) else item for item in value]
        else:
            decoded[name] = value
    return decoded
