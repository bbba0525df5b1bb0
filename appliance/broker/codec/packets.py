"""Version-independent MQTT control packets.

One dataclass per packet type serves both MQTT 3.1.1 and MQTT 5: fields 3.1.1 cannot express (reason
codes, properties) simply stay at their defaults there, and the writer leaves them out. Keeping a single
set of types (as rumqttd's ``protocol`` module does) means the session and router never branch on the
version except where the protocol really differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: A packet's MQTT 5 properties by identifier (``properties`` knows their types and encodes them).
Properties = dict[int, Any]

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15

MQTT_311 = 4
MQTT_5 = 5


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    type = CONNECT
    protocol_level: int
    client_id: str
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=dict)
    protocol_name: str = "MQTT"


@dataclass(slots=True)
class Connack:
    type = CONNACK
    session_present: bool = False
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    """``frame`` is the complete packet as received (set by the reader, not compared): a broker can often
    forward those exact bytes instead of encoding the same PUBLISH again."""

    type = PUBLISH
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)
    frame: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class PubAck:
    type = PUBACK
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRec:
    type = PUBREC
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRel:
    type = PUBREL
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubComp:
    type = PUBCOMP
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


class SubscribeRequest(NamedTuple):
    """One topic filter of a SUBSCRIBE with its options byte unpacked."""

    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    type = SUBSCRIBE
    packet_id: int
    subscriptions: list[SubscribeRequest]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Suback:
    type = SUBACK
    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    type = UNSUBSCRIBE
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsuback:
    """``reason_codes`` is empty when read from MQTT 3.1.1, which has none (the writer leaves them out)."""

    type = UNSUBACK
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PingReq:
    type = PINGREQ


@dataclass(slots=True)
class PingResp:
    type = PINGRESP


@dataclass(slots=True)
class Disconnect:
    type = DISCONNECT
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    type = AUTH
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect | Connack | Publish | PubAck | PubRec | PubRel | PubComp | Subscribe | Suback | Unsubscribe | Unsuback
    | PingReq | PingResp | Disconnect | Auth
)
