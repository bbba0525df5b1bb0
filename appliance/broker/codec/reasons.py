"""MQTT 5 reason codes and the one exception the codec and session raise for bad input.

Every protocol failure, whatever layer finds it, is reported as an ``MqttProtocolError`` carrying the MQTT 5
reason code. The connection layer turns that into a DISCONNECT (MQTT 5) or a plain close (3.1.1) in one
place, so no handler has to know how to end a connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from appliance.broker.codec.packets import Packet

SUCCESS = 0x00
GRANTED_QOS_1 = 0x01
GRANTED_QOS_2 = 0x02
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
CONTINUE_AUTHENTICATION = 0x18
REAUTHENTICATE = 0x19
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
BAD_USERNAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_IDENTIFIER_IN_USE = 0x91
PACKET_IDENTIFIER_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
MESSAGE_RATE_TOO_HIGH = 0x96
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
MAXIMUM_CONNECT_TIME = 0xA0
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

#: MQTT 3.1.1 CONNACK return codes for the MQTT 5 reasons that have an equivalent (3.1.1 section 3.2.2.3).
V311_CONNACK_CODES: dict[int, int] = {
    SUCCESS: 0,
    UNSUPPORTED_PROTOCOL_VERSION: 1,
    CLIENT_IDENTIFIER_NOT_VALID: 2,
    SERVER_UNAVAILABLE: 3,
    SERVER_BUSY: 3,
    SERVER_SHUTTING_DOWN: 3,
    CONNECTION_RATE_EXCEEDED: 3,
    QUOTA_EXCEEDED: 3,  # the store is full: the service is unavailable
    UNSPECIFIED_ERROR: 3,
    BAD_USERNAME_OR_PASSWORD: 4,
    BAD_AUTHENTICATION_METHOD: 4,
    NOT_AUTHORIZED: 5,
    BANNED: 5,
}

#: And back: what a 3.1.1 CONNACK return code means as an MQTT 5 reason (for clients of the codec).
V311_CONNACK_REASONS: dict[int, int] = {
    0: SUCCESS,
    1: UNSUPPORTED_PROTOCOL_VERSION,
    2: CLIENT_IDENTIFIER_NOT_VALID,
    3: SERVER_UNAVAILABLE,
    4: BAD_USERNAME_OR_PASSWORD,
    5: NOT_AUTHORIZED,
}

NAMES: dict[int, str] = {
    value: name.lower().replace("_", " ") for name, value in list(globals().items()) if name.isupper() and isinstance(value, int)
}


def reason_name(code: int) -> str:
    return NAMES.get(code, f"reason 0x{code:02X}")


class MqttProtocolError(Exception):
    """Bad input from a peer: malformed bytes, a size limit, or a packet that breaks the protocol rules."""

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(f"{message} (0x{reason_code:02X} {reason_name(reason_code)})")
        self.reason_code = reason_code
        self.message = message
        #: Packets the reader completed in the same read before the bad one; they are still handled.
        self.parsed: list[Packet] = []
