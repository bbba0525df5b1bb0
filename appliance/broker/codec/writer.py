"""Encode packets to bytes for a given protocol level.

``encode`` handles every packet type for both versions (a ``match`` on the packet class, so each branch
sees its own type); 3.1.1 simply leaves out what it cannot express. This is the one place the MQTT 3.1.1
downgrade happens: handlers always pass MQTT 5 reason codes.
The broker's hot path does not go through it: ``encode_publish`` and ``encode_ack`` build the two packets
sent per message directly from their parts, without a packet object, and a PUBLISH delivered to many
subscribers is encoded once per distinct header (see ``router``).
"""

from __future__ import annotations

import struct
from functools import partial

from appliance.broker.codec.packets import (
    MQTT_5,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBREL,
    SUBACK,
    UNSUBACK,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from appliance.broker.codec.properties import (
    Properties,
    encode_binary,
    encode_properties,
    encode_utf8,
    encode_varint,
)
from appliance.broker.codec.reasons import V311_CONNACK_CODES

_U16 = struct.Struct(">H")
_ACK_FIXED = struct.Struct(">BBH")
_ACK_REASON = struct.Struct(">BBHB")
#: ``puback_success(packet_id)``: the PUBACK of an accepted QoS 1 PUBLISH (reason code 0, no properties:
#: MQTT 5's short form, 3.1.1's only one), the same bytes ``encode_ack`` returns for it. One is written
#: per QoS 1 message, so this is a C call (a partial of ``Struct.pack``) rather than a Python frame.
puback_success = partial(struct.Struct(">HH").pack, (PUBACK << 12) | 2)
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


def encode_ack(packet_type: int, packet_id: int, protocol_level: int, reason_code: int = 0,
               properties: Properties | None = None) -> bytes:
    """PUBACK/PUBREC/PUBREL/PUBCOMP. The reason code and properties are omitted when they are the
    defaults (the MQTT 5 short form), and always for 3.1.1, which has neither: callers pass the MQTT 5
    reason code whatever the version, and this is the one place it is dropped."""
    first = (packet_type << 4) | (2 if packet_type == PUBREL else 0)
    if protocol_level != MQTT_5:
        return _ACK_FIXED.pack(first, 2, packet_id)
    if properties:
        return _frame(first, _U16.pack(packet_id) + bytes((reason_code,)) + encode_properties(properties))
    if reason_code:
        return _ACK_REASON.pack(first, 3, packet_id, reason_code)
    return _ACK_FIXED.pack(first, 2, packet_id)


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode any packet. Reason codes are always the MQTT 5 ones; for 3.1.1 the writer leaves out what
    that version cannot express (properties, most reason codes) and maps the rest (CONNACK return codes,
    SUBACK's 0x80)."""
    v5 = protocol_level == MQTT_5
    match packet:
        case Publish():
            return encode_publish(packet.topic.encode("utf-8"), packet.payload, packet.qos, packet.retain, packet.dup,
                                  packet.packet_id, encode_properties(packet.properties) if v5 else None)
        case PubAck() | PubRec() | PubRel() | PubComp():
            return encode_ack(packet.type, packet.packet_id, protocol_level, packet.reason_code, packet.properties)
        case Connect():
            return _frame(0x10, _connect_body(packet, v5))
        case Connack():
            if v5:
                return _frame(0x20, bytes((int(packet.session_present), packet.reason_code))
                              + encode_properties(packet.properties))
            code = V311_CONNACK_CODES.get(packet.reason_code, 5 if packet.reason_code else 0)
            return _frame(0x20, bytes((int(packet.session_present), code)))
        case Subscribe():
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
        case Suback():
            body = bytearray(_U16.pack(packet.packet_id))
            if v5:
                body += encode_properties(packet.properties) + bytes(packet.reason_codes)
            else:
                body += bytes(code if code < 0x80 else 0x80 for code in packet.reason_codes)
            return _frame(SUBACK << 4, body)
        case Unsuback():
            body = bytearray(_U16.pack(packet.packet_id))
            if v5:
                body += encode_properties(packet.properties) + bytes(packet.reason_codes)
            return _frame(UNSUBACK << 4, body)
        case Unsubscribe():
            body = bytearray(_U16.pack(packet.packet_id))
            if v5:
                body += encode_properties(packet.properties)
            for topic_filter in packet.topic_filters:
                body += encode_utf8(topic_filter)
            return _frame(0xA2, body)
        case PingReq():
            return PINGREQ_BYTES
        case PingResp():
            return PINGRESP_BYTES
        case Disconnect() | Auth():
            if not v5 or (not packet.reason_code and not packet.properties):
                return bytes((packet.type << 4, 0))
            body = bytearray((packet.reason_code,))
            if packet.properties:
                body += encode_properties(packet.properties)
            return _frame(packet.type << 4, body)
    raise ValueError(f"cannot encode {packet!r}")


def _connect_body(packet: Connect, v5: bool) -> bytes:
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
