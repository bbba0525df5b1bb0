"""The contract between the broker and the services that live inside its process.

The state store and the store-and-forward pipeline are *implicit subscribers*: they see publishes on the
topics they claim before the broker acknowledges them, and they publish responses and notifications back
through the broker without a network hop. Keeping this contract in one small module lets each service be
built and tested without knowing how sessions, the codec or the socket layer work.

Ordering and durability rules a service can rely on:

* ``on_publish`` is awaited before the PUBACK/PUBREC for a QoS 1/2 message is sent, so a service that
  commits to disk inside it gets "acknowledged means durable" for free. Its verdict's reason code is what the
  publisher sees in the PUBACK/PUBREC (MQTT 5) - for MQTT 3.1.1 a failure reason closes nothing, the
  broker just acknowledges (3.1.1 has no way to say no), unless the verdict also disconnects: then the
  3.1.1 client gets no acknowledgement at all and sends the message again after reconnecting - what a
  service whose own commit failed answers (the message is not stored, so it must not be acknowledged).
* Calls for one client arrive in that client's publish order.
* ``BrokerHandle.publish`` only enqueues: it never blocks and never awaits the network, so a service can
  call it from inside ``on_publish`` and messages it publishes reach subscribers in call order.

Reason codes: a service takes the ones it may use from here (``PUBLISH_REASON_CODES`` for a verdict,
``DISCONNECT_REASON_CODES`` for ``disconnect``), always as MQTT 5 defines them; the broker's writer
drops or maps them for MQTT 3.1.1 clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from appliance.broker.codec.reasons import (
    ADMINISTRATIVE_ACTION,
    IMPLEMENTATION_SPECIFIC_ERROR,
    NO_MATCHING_SUBSCRIBERS,
    NOT_AUTHORIZED,
    PAYLOAD_FORMAT_INVALID,
    QUOTA_EXCEEDED,
    SUCCESS,
    TOPIC_NAME_INVALID,
    UNSPECIFIED_ERROR,
)

if TYPE_CHECKING:
    from appliance.prometheus import Family

__all__ = [
    "ACCEPTED", "ADMINISTRATIVE_ACTION", "DISCONNECT_REASON_CODES", "IMPLEMENTATION_SPECIFIC_ERROR",
    "NOT_AUTHORIZED", "NO_MATCHING_SUBSCRIBERS", "PAYLOAD_FORMAT_INVALID", "PUBLISH_REASON_CODES", "QUOTA_EXCEEDED",
    "SUCCESS", "TOPIC_NAME_INVALID", "UNSPECIFIED_ERROR", "BrokerHandle", "BrokerService", "InboundPublish",
    "PublishVerdict", "ServiceDefaults", "ServiceStartError",
]

#: What a PUBACK/PUBREC may carry (MQTT 5 3.4.2.1), and so what a ``PublishVerdict`` may say.
PUBLISH_REASON_CODES = frozenset({
    SUCCESS, NO_MATCHING_SUBSCRIBERS, UNSPECIFIED_ERROR, IMPLEMENTATION_SPECIFIC_ERROR, NOT_AUTHORIZED,
    TOPIC_NAME_INVALID, QUOTA_EXCEEDED, PAYLOAD_FORMAT_INVALID,
})
#: What a service may close a client with (``PublishVerdict.disconnect``, ``BrokerHandle.disconnect``).
DISCONNECT_REASON_CODES = frozenset({
    UNSPECIFIED_ERROR, IMPLEMENTATION_SPECIFIC_ERROR, NOT_AUTHORIZED, TOPIC_NAME_INVALID, QUOTA_EXCEEDED,
    ADMINISTRATIVE_ACTION, PAYLOAD_FORMAT_INVALID,
})


@dataclass(slots=True)
class InboundPublish:
    """A publish from a connected client, as a service sees it (topic alias already resolved)."""

    client_id: str
    username: str | None
    protocol_level: int  # 4 = MQTT 3.1.1, 5 = MQTT 5
    topic: str
    payload: bytes
    qos: int
    retain: bool
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    message_expiry_interval: int | None = None
    payload_format_indicator: int | None = None


@dataclass(slots=True)
class PublishVerdict:
    """What a service says about an inbound publish.

    ``reason_code`` goes into the MQTT 5 PUBACK/PUBREC (0 = success, >= 0x80 failure). ``disconnect``, when
    set, is the reason code of a DISCONNECT the broker sends before closing the publisher's connection.
    ``route`` False keeps the message from ordinary subscribers (the service consumed it).
    """

    reason_code: int = 0
    reason_string: str | None = None
    disconnect: int | None = None
    route: bool = True

    def __post_init__(self) -> None:
        if self.reason_code not in PUBLISH_REASON_CODES:
            raise ValueError(f"a PUBACK/PUBREC cannot carry reason code 0x{self.reason_code:02X}")
        if self.disconnect is not None and self.disconnect not in DISCONNECT_REASON_CODES:
            raise ValueError(f"a service cannot disconnect with reason code 0x{self.disconnect:02X}")


ACCEPTED = PublishVerdict()


class ServiceStartError(Exception):
    """A service cannot start as configured (``appliance run`` refuses to start); the text says what to fix."""


class BrokerHandle(Protocol):
    """What a service may ask of the broker."""

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        *,
        user_properties: list[tuple[str, str]] | None = None,
        content_type: str | None = None,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        message_expiry_interval: int | None = None,
        payload_format_indicator: int | None = None,
    ) -> None:
        """Route a message from the broker itself to matching subscribers (and retain it if asked)."""

    def disconnect(self, client_id: str, reason_code: int, reason_string: str | None = None) -> None:
        """Close a client's connection (MQTT 5: DISCONNECT with ``reason_code`` first)."""

    def may_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        """Whether that client may itself publish to ``topic`` under the ACL in force now. A service that
        publishes on a client's behalf (a response topic the client chose) asks first, so it is never
        a deputy that writes where the client may not."""

    def serves(self, topic: str) -> bool:
        """Whether an in-process service takes publishes on ``topic`` (a request topic). A reply the broker
        publishes there skips that service and reaches the topic's subscribers as though a client had
        asked, so no response topic may name one."""



class BrokerService(Protocol):
    """A component that lives inside the broker, such as the state store."""

    #: Topic filters (MQTT wildcard syntax) whose publishes go to ``on_publish``.
    topic_filters: tuple[str, ...]

    async def start(self, broker: BrokerHandle) -> None:
        """Called once the broker's stores are open, before listeners accept clients."""

    async def on_publish(self, message: InboundPublish) -> PublishVerdict:
        """Handle a publish on one of ``topic_filters``; awaited before the publisher's acknowledgement."""

    def on_client_disconnected(self, client_id: str) -> None:
        """The client's network connection ended (normally or not); its session may live on."""

    async def stop(self) -> None:
        """Called on shutdown after listeners have closed."""

    def reload(self) -> None:
        """SIGHUP: re-read what the service may re-read without a restart (before the broker's own ACL
        and password file are reloaded)."""

    def show_ready(self) -> None:
        """The gateway is up: listeners accept, systemd was told READY (the hardware lights its LED)."""

    def healthy(self) -> bool:
        """Whether the service does its work; while any service says no, the gateway stops feeding the
        systemd watchdog, so one that stays unhealthy has the gateway restarted."""

    async def metrics(self) -> Sequence[Family]:
        """The service's figures for the gateway's Prometheus page, read at each scrape."""


class ServiceDefaults:
    """Base for services that have nothing to do on some of the contract's calls."""

    def on_client_disconnected(self, client_id: str) -> None:
        return None

    def reload(self) -> None:
        return None

    def show_ready(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    async def metrics(self) -> Sequence[Family]:
        return ()
