"""MQTT 5 properties: their wire types, which packet may carry which, and their encoding.

Properties travel as a plain ``dict[int, value]`` keyed by property identifier, the same in every packet
type, so the broker can forward a PUBLISH's properties untouched without knowing them all. Two
identifiers may repeat and therefore hold lists: user properties (``list[tuple[str, str]]``) and
subscription identifiers (``list[int]``). The table ``ALLOWED`` is the codec's equivalent of mosquitto's
``mosquitto_property_check_command``: a property in the wrong packet is a protocol error.
"""

from __future__ import annotations

import struct
from typing import Any

from appliance.broker.codec.packets import Properties as Properties  # defined with the packets that carry them
from appliance.broker.codec.reasons import (
    MALFORMED_PACKET,
    PROTOCOL_ERROR,
    QUOTA_EXCEEDED,
    TOPIC_ALIAS_INVALID,
    MqttProtocolError,
)

#: What the decoders read from: the reader's receive buffer is a bytearray, single packets are bytes.
ByteSource = bytes | bytearray

PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

BYTE, U16, U32, VARINT, UTF8, BINARY, PAIR = range(7)

TYPES: dict[int, int] = {
    PAYLOAD_FORMAT_INDICATOR: BYTE,
    MESSAGE_EXPIRY_INTERVAL: U32,
    CONTENT_TYPE: UTF8,
    RESPONSE_TOPIC: UTF8,
    CORRELATION_DATA: BINARY,
    SUBSCRIPTION_IDENTIFIER: VARINT,
    SESSION_EXPIRY_INTERVAL: U32,
    ASSIGNED_CLIENT_IDENTIFIER: UTF8,
    SERVER_KEEP_ALIVE: U16,
    AUTHENTICATION_METHOD: UTF8,
    AUTHENTICATION_DATA: BINARY,
    REQUEST_PROBLEM_INFORMATION: BYTE,
    WILL_DELAY_INTERVAL: U32,
    REQUEST_RESPONSE_INFORMATION: BYTE,
    RESPONSE_INFORMATION: UTF8,
    SERVER_REFERENCE: UTF8,
    REASON_STRING: UTF8,
    RECEIVE_MAXIMUM: U16,
    TOPIC_ALIAS_MAXIMUM: U16,
    TOPIC_ALIAS: U16,
    MAXIMUM_QOS: BYTE,
    RETAIN_AVAILABLE: BYTE,
    USER_PROPERTY: PAIR,
    MAXIMUM_PACKET_SIZE: U32,
    WILDCARD_SUBSCRIPTION_AVAILABLE: BYTE,
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: BYTE,
    SHARED_SUBSCRIPTION_AVAILABLE: BYTE,
}

#: Identifiers that may appear more than once; they decode to lists.
REPEATABLE = frozenset({USER_PROPERTY, SUBSCRIPTION_IDENTIFIER})

# Packet "kinds" for the table below. WILL is the will properties block inside CONNECT.
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK = 1, 2, 3, 4, 5, 6, 7, 8, 9
UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH, WILL = 10, 11, 14, 15, 99

_ACK_KINDS = {PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK}
ALLOWED: dict[int, frozenset[int]] = {
    PAYLOAD_FORMAT_INDICATOR: frozenset({PUBLISH, WILL}),
    MESSAGE_EXPIRY_INTERVAL: frozenset({PUBLISH, WILL}),
    CONTENT_TYPE: frozenset({PUBLISH, WILL}),
    RESPONSE_TOPIC: frozenset({PUBLISH, WILL}),
    CORRELATION_DATA: frozenset({PUBLISH, WILL}),
    SUBSCRIPTION_IDENTIFIER: frozenset({PUBLISH, SUBSCRIBE}),
    SESSION_EXPIRY_INTERVAL: frozenset({CONNECT, CONNACK, DISCONNECT}),
    ASSIGNED_CLIENT_IDENTIFIER: frozenset({CONNACK}),
    SERVER_KEEP_ALIVE: frozenset({CONNACK}),
    AUTHENTICATION_METHOD: frozenset({CONNECT, CONNACK, AUTH}),
    AUTHENTICATION_DATA: frozenset({CONNECT, CONNACK, AUTH}),
    REQUEST_PROBLEM_INFORMATION: frozenset({CONNECT}),
    WILL_DELAY_INTERVAL: frozenset({WILL}),
    REQUEST_RESPONSE_INFORMATION: frozenset({CONNECT}),
    RESPONSE_INFORMATION: frozenset({CONNACK}),
    SERVER_REFERENCE: frozenset({CONNACK, DISCONNECT}),
    REASON_STRING: frozenset({CONNACK, DISCONNECT, AUTH} | _ACK_KINDS),
    RECEIVE_MAXIMUM: frozenset({CONNECT, CONNACK}),
    TOPIC_ALIAS_MAXIMUM: frozenset({CONNECT, CONNACK}),
    TOPIC_ALIAS: frozenset({PUBLISH}),
    MAXIMUM_QOS: frozenset({CONNACK}),
    RETAIN_AVAILABLE: frozenset({CONNACK}),
    USER_PROPERTY: frozenset({CONNECT, CONNACK, PUBLISH, WILL, SUBSCRIBE, UNSUBSCRIBE, DISCONNECT, AUTH} | _ACK_KINDS),
    MAXIMUM_PACKET_SIZE: frozenset({CONNECT, CONNACK}),
    WILDCARD_SUBSCRIPTION_AVAILABLE: frozenset({CONNACK}),
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: frozenset({CONNACK}),
    SHARED_SUBSCRIPTION_AVAILABLE: frozenset({CONNACK}),
}

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def encode_varint(value: int) -> bytes:
    if value < 128:
        return bytes((value,))
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: ByteSource, pos: int, end: int) -> tuple[int, int]:
    """A variable byte integer at ``pos``: (value, position after it). At most four bytes."""
    value = 0
    shift = 0
    for _ in range(4):
        if pos >= end:
            raise MqttProtocolError(MALFORMED_PACKET, "truncated variable byte integer")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise MqttProtocolError(MALFORMED_PACKET, "variable byte integer longer than four bytes")


def encode_utf8(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _U16.pack(len(raw)) + raw


def encode_binary(value: bytes) -> bytes:
    return _U16.pack(len(value)) + value


def decode_utf8(data: ByteSource, pos: int, end: int) -> tuple[str, int]:
    raw, pos = decode_binary(data, pos, end)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MqttProtocolError(MALFORMED_PACKET, "string is not valid UTF-8") from None
    if "\x00" in text:
        raise MqttProtocolError(MALFORMED_PACKET, "string contains U+0000")
    return text, pos


def decode_binary(data: ByteSource, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MqttProtocolError(MALFORMED_PACKET, "truncated length prefix")
    length = (data[pos] << 8) | data[pos + 1]
    pos += 2
    if pos + length > end:
        raise MqttProtocolError(MALFORMED_PACKET, "string or binary data runs past the packet")
    return bytes(data[pos : pos + length]), pos + length


def encode_properties(properties: Properties) -> bytes:
    """The property block including its variable byte integer length."""
    if not properties:
        return b"\x00"
    out = bytearray()
    for ident, value in properties.items():
        kind = TYPES[ident]
        items = value if ident in REPEATABLE else (value,)
        for item in items:
            out.append(ident)
            if kind == BYTE:
                out.append(item)
            elif kind == U16:
                out += _U16.pack(item)
            elif kind == U32:
                out += _U32.pack(item)
            elif kind == VARINT:
                out += encode_varint(item)
            elif kind == UTF8:
                out += encode_utf8(item)
            elif kind == BINARY:
                out += encode_binary(item)
            else:
                out += encode_utf8(item[0])
                out += encode_utf8(item[1])
    return encode_varint(len(out)) + out


def decode_properties(data: ByteSource, pos: int, end: int, kind: int,
                      max_repeats: int | None = None) -> tuple[Properties, int]:
    """Decode a property block for packet ``kind``; returns (properties, position after the block).

    ``max_repeats`` (the broker's ``max_user_properties``; None: no cap) bounds each repeatable property
    (user properties, subscription identifiers) per block. The check runs as each one is read, so a
    hostile block of 400,000 tiny user properties costs at most that many decoded pairs before
    the packet is refused with 0x97 Quota exceeded ("an implementation or administrative imposed limit
    has been exceeded", MQTT 5 2.4): the packet is well-formed and within the Maximum Packet Size, so
    neither 0x81 nor 0x95 would be true.
    """
    length, pos = decode_varint(data, pos, end)
    if length == 0:
        return {}, pos
    stop = pos + length
    if stop > end:
        raise MqttProtocolError(MALFORMED_PACKET, "properties run past the packet")
    properties: Properties = {}
    while pos < stop:
        ident, pos = decode_varint(data, pos, stop)
        type_ = TYPES.get(ident)
        if type_ is None:
            raise MqttProtocolError(MALFORMED_PACKET, f"unknown property 0x{ident:02X}")
        if kind not in ALLOWED[ident]:
            raise MqttProtocolError(PROTOCOL_ERROR, f"property 0x{ident:02X} is not allowed in this packet")
        value: Any
        if type_ == BYTE:
            if pos >= stop:
                raise MqttProtocolError(MALFORMED_PACKET, "truncated property")
            value = data[pos]
            pos += 1
        elif type_ == U16:
            if pos + 2 > stop:
                raise MqttProtocolError(MALFORMED_PACKET, "truncated property")
            value = (data[pos] << 8) | data[pos + 1]
            pos += 2
        elif type_ == U32:
            if pos + 4 > stop:
                raise MqttProtocolError(MALFORMED_PACKET, "truncated property")
            value = _U32.unpack_from(data, pos)[0]
            pos += 4
        elif type_ == VARINT:
            value, pos = decode_varint(data, pos, stop)
        elif type_ == UTF8:
            value, pos = decode_utf8(data, pos, stop)
        elif type_ == BINARY:
            value, pos = decode_binary(data, pos, stop)
        else:
            key, pos = decode_utf8(data, pos, stop)
            text, pos = decode_utf8(data, pos, stop)
            value = (key, text)
        if ident in REPEATABLE:
            repeated = properties.setdefault(ident, [])
            if max_repeats is not None and len(repeated) >= max_repeats:
                raise MqttProtocolError(QUOTA_EXCEEDED, f"more than {max_repeats} of property 0x{ident:02X} in one packet")
            repeated.append(value)
        elif ident in properties:
            raise MqttProtocolError(PROTOCOL_ERROR, f"property 0x{ident:02X} appears twice")
        else:
            properties[ident] = value
    _check_values(properties)
    return properties, pos


def _check_values(properties: Properties) -> None:
    """Values the specification forbids outright (MQTT 5 section 2.2.2.2 and the property definitions)."""
    for ident in (PAYLOAD_FORMAT_INDICATOR, REQUEST_PROBLEM_INFORMATION, REQUEST_RESPONSE_INFORMATION, MAXIMUM_QOS,
                  RETAIN_AVAILABLE, WILDCARD_SUBSCRIPTION_AVAILABLE, SUBSCRIPTION_IDENTIFIER_AVAILABLE,
                  SHARED_SUBSCRIPTION_AVAILABLE):
        if properties.get(ident, 0) > 1:
            raise MqttProtocolError(PROTOCOL_ERROR, f"property 0x{ident:02X} must be 0 or 1")
    if properties.get(RECEIVE_MAXIMUM) == 0:
        raise MqttProtocolError(PROTOCOL_ERROR, "receive maximum of 0")
    if properties.get(MAXIMUM_PACKET_SIZE) == 0:
        raise MqttProtocolError(PROTOCOL_ERROR, "maximum packet size of 0")
    if properties.get(TOPIC_ALIAS) == 0:
        raise MqttProtocolError(TOPIC_ALIAS_INVALID, "topic alias 0")
    for sub_id in properties.get(SUBSCRIPTION_IDENTIFIER, ()):
        if sub_id == 0:
            raise MqttProtocolError(PROTOCOL_ERROR, "subscription identifier 0")

