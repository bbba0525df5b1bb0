"""Encode packets to bytes for a given protocol level.

``encode`` handles every packet type for both versions; 3.1.1 simply leaves out what it cannot express.
The broker's hot path does not go through it: ``encode_publish`` and ``encode_ack`` build the two packets
sent per message directly from their parts, without a packet object, and a PUBLISH delivered to many
subscribers is encoded once per distinct header (see ``router``).
"""

from __future__ import annotations

import struct

from appliance.broker.codec.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MQTT_5,
    PINGREQ,
    PINGRESP,
    PUBLISH,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Packet,
)
from appliance.broker.codec.properties import Properties, encode_binary, encode_properties, encode_utf8, encode_varint
from appliance.broker.codec.reasons import V311_CONNACK_CODES

_U16 = struct.Struct(">H")
_ACK_FIXED = struct.Struct(">BBH")
_ACK_REASON = struct.Struct(">BBHB")
PINGRESP_BYTES = bytes((PINGRESP << 4, 0))
PINGREQ_BYTES = bytes((PINGREQ << 4, 0))


def _frame(first: int, body: bytes | bytearray) -> bytes:
    length = len(body)
    if length < 128:
        return bytes((first, length)) + body
    return bytes((first,)) + encode_varint(length) + body


def encode_publish(
    topic: bytes, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None, properties: bytes | None
) -> bytes:
    """A PUBLISH from pre-encoded parts: ``topic`` is UTF-8 without its length prefix, ``properties`` is the
    complete property block (with its length) for MQTT 5, or None for 3.1.1."""
    first = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    head = _U16.pack(len(topic)) + topic
    if qos:
        head += _U16.pack(packet_id or 0)
    if properties is not None:
        head += properties
    length = len(head) + len(payload)
    if length < 128:
        return bytes((first, length)) + head + payload
    return bytes((first,)) + encode_varint(length) + head + payload


def encode_ack(packet_type: int, packet_id: int, reason_code: int = 0, properties: Properties | None = None) -> bytes:
    """PUBACK/PUBREC/PUBREL/PUBCOMP. The reason code and properties are omitted when they are the
    defaults, which is both the MQTT 5 short form and the only form 3.1.1 knows."""
    first = (packet_type << 4) | (2 if packet_type == PUBREL else 0)
    if properties:
        return _frame(first, _U16.pack(packet_id) + bytes((reason_code,)) + encode_properties(properties))
    if reason_code:
        return _ACK_REASON.pack(first, 3, packet_id, reason_code)
    return _ACK_FIXED.pack(first, 2, packet_id)


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode any packet; properties and reason codes are written only for MQTT 5."""
    v5 = protocol_level == MQTT_5
    kind = packet.type
    if kind == PUBLISH:
        return encode_publish(
            packet.topic.encode("utf-8"),
            packet.payload,
            packet.qos,
            packet.retain,
            packet.dup,
            packet.packet_id,
            encode_properties(packet.properties) if v5 else None,
        )
    if kind in (4, 5, 6, 7):
        if v5:
            return encode_ack(kind, packet.packet_id, packet.reason_code, packet.properties)
        return encode_ack(kind, packet.packet_id)
    if kind == CONNECT:
        return _frame(0x10, _connect_body(packet, v5))
    if kind == CONNACK:
        code = packet.reason_code if v5 else V311_CONNACK_CODES.get(packet.reason_code, 5 if packet.reason_code else 0)
        body = bytes((1 if packet.session_present else 0, code))
        if v5:
            body += encode_properties(packet.properties)
        return _frame(0x20, body)
    if kind == SUBSCRIBE:
        body = bytearray(_U16.pack(packet.packet_id))
        if v5:
            body += encode_properties(packet.properties)
        for request in packet.subscriptions:
            body += encode_utf8(request.topic_filter)
            options = request.qos
            if v5:
                options |= (4 if request.no_local else 0) | (8 if request.retain_as_published else 0)
                options |= request.retain_handling << 4
            body.append(options)
        return _frame(0x82, body)
    if kind == SUBACK or kind == UNSUBACK:
        body = bytearray(_U16.pack(packet.packet_id))
        if v5:
            body += encode_properties(packet.properties)
            body += bytes(packet.reason_codes)
        elif kind == SUBACK:
            body += bytes(code if code < 0x80 else 0x80 for code in packet.reason_codes)
        return _frame(kind << 4, body)
    if kind == UNSUBSCRIBE:
        body = bytearray(_U16.pack(packet.packet_id))
        if v5:
            body += encode_properties(packet.properties)
        for topic_filter in packet.topic_filters:
            body += encode_utf8(topic_filter)
        return _frame(0xA2, body)
    if kind == PINGREQ:
        return PINGREQ_BYTES
    if kind == PINGRESP:
        return PINGRESP_BYTES
    if kind == DISCONNECT or kind == AUTH:
        if not v5 or (not packet.reason_code and not packet.properties):
            return bytes((kind << 4, 0))
        body = bytes((packet.reason_code,))
        if packet.properties:
            body += encode_properties(packet.properties)
        return _frame(kind << 4, body)
    raise ValueError(f"cannot encode packet type {kind}")


def _connect_body(packet: Packet, v5: bool) -> bytes:
    will = packet.will
    flags = 0x02 if packet.clean_start else 0
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if packet.username is not None:
        flags |= 0x80
    if packet.password is not None:
        flags |= 0x40
    body = bytearray(encode_utf8(packet.protocol_name))
    body += bytes((packet.protocol_level, flags)) + _U16.pack(packet.keep_alive)
    if v5:
        body += encode_properties(packet.properties)
    body += encode_utf8(packet.client_id)
    if will is not None:
        if v5:
            body += encode_properties(will.properties)
        body += encode_utf8(will.topic)
        body += encode_binary(will.payload)
    if packet.username is not None:
        body += encode_utf8(packet.username)
    if packet.password is not None:
        body += encode_binary(packet.password)
    return bytes(body)
