"""Incremental MQTT framing and parsing: bytes in, every complete packet out.

``PacketReader.feed`` parses *all* packets already buffered in one call, the way rumqttd's ``readv``
does, so the broker can handle a whole batch (and write its replies once) per socket read. Partial
packets stay buffered; the reader remembers how many bytes the next packet needs so a large payload
arriving in many small reads is not re-parsed on every read.

Anything malformed raises ``MqttProtocolError`` with the MQTT 5 reason code (0x81 malformed packet, 0x82
protocol error, 0x95 packet too large, 0x84 unsupported protocol version); nothing else escapes.
"""

from __future__ import annotations

from appliance.broker.cache_bounds import MAX_CACHED_KEY_CHARS
from appliance.broker.codec import properties as props
from appliance.broker.codec.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MQTT_5,
    MQTT_311,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
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
    SubscribeRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from appliance.broker.codec.properties import (
    Properties,
    decode_binary,
    decode_properties,
    decode_utf8,
)
from appliance.broker.codec.reasons import (
    MALFORMED_PACKET,
    PACKET_TOO_LARGE,
    PROTOCOL_ERROR,
    QUOTA_EXCEEDED,
    TOPIC_NAME_INVALID,
    UNSUPPORTED_PROTOCOL_VERSION,
    V311_CONNACK_REASONS,
    MqttProtocolError,
)

#: The largest packet MQTT can frame: a 4-byte remaining length plus the 5-byte fixed header.
ABSOLUTE_MAX_PACKET_SIZE = 268_435_455 + 5

_REQUIRED_FLAGS = {PUBREL: 2, SUBSCRIBE: 2, UNSUBSCRIBE: 2}

#: Validated PUBLISH topic names remembered per reader: a device publishes to a handful of topics over
#: and over, so decoding and checking the same bytes for every message is wasted work. Cleared when full.
TOPIC_CACHE_SIZE = 256
#: ... or when its raw topics pass this many bytes; a topic over ``MAX_CACHED_KEY_CHARS`` (1 KiB) is not
#: kept (``cache_bounds``). A connection's cache thus holds ~50 KB at most, not 256 x 128 KB.
TOPIC_CACHE_BYTES = 8192
#: Topic filters one SUBSCRIBE or UNSUBSCRIBE may carry. Each costs an ACL check, a tree walk and (durable)
#: a stored row, all in one loop turn: 100,000 one-character filters (a 0.7 MB packet, well within the
#: Maximum Packet Size) held the loop for 4 s. Real clients send a handful; more is refused like the
#: other per-packet caps (DISCONNECT 0x97 Quota exceeded; docs/broker-security.md).
MAX_FILTERS_PER_PACKET = 256


def remaining_length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The remaining length of the fixed header at ``pos`` when it takes more than one byte (the second
    byte has its continuation bit): (length, bytes of the fixed header), or (0, 0) while ``buf`` ends
    inside it. More than four length bytes is a malformed packet (MQTT 5 1.5.5). Read apart from the
    one-byte case so that the common packet costs no call."""
    length = buf[pos + 1] & 0x7F
    header = 2
    shift = 7
    while True:
        if pos + header >= end:
            return 0, 0
        byte = buf[pos + header]
        header += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return length, header
        shift += 7
        if header == 5:
            raise MqttProtocolError(MALFORMED_PACKET, "remaining length longer than four bytes")


class PacketReader:
    """Frames and parses packets for one connection.

    ``protocol_level`` starts at 3.1.1 and switches as soon as a CONNECT is parsed (a server reader) or
    when the owner sets it (a client reader after sending its CONNECT).
    """

    __slots__ = ("protocol_level", "max_packet_size", "max_topic_levels", "max_user_properties", "pending", "_need",
                 "_topics", "_topic_bytes")

    def __init__(self, max_packet_size: int = ABSOLUTE_MAX_PACKET_SIZE, protocol_level: int = MQTT_311) -> None:
        self.protocol_level = protocol_level
        self.max_packet_size = max_packet_size
        #: The broker's ``max_topic_levels`` for PUBLISH and will topic names (None: no cap, a client's
        #: reader): a deeper one is refused with 0x90 before anything is built from it.
        self.max_topic_levels: int | None = None
        #: The broker's ``max_user_properties`` (``properties.decode_properties``; None: no cap).
        self.max_user_properties: int | None = None
        #: The bytes of a packet not complete yet (empty between packets). An attribute, not a property over
        #: a private one: the broker's short path reads it for every read, and a property is one more
        #: Python frame entered from C.
        self.pending = bytearray()
        self._need = 0
        self._topics: dict[bytes, str] = {}
        self._topic_bytes = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Add ``data`` and return every packet now complete, in order."""
        pending = self.pending
        if pending:
            pending += data
            if len(pending) < self._need:
                return []
            # Parsed as bytes, so that the topic, payload and frame are slices of it without a further
            # copy each (slices of a bytearray are bytearrays, which ``bytes()`` copied once more).
            buf = bytes(pending)
        else:
            # A bytearray or memoryview is copied once.
            buf = data if data.__class__ is bytes else bytes(data)
        packets: list[Packet] = []
        try:
            pos = self._parse_into(buf, packets)
        except MqttProtocolError as exc:
            exc.parsed = packets
            raise
        if pending:
            del pending[:pos]
        elif pos < len(buf):
            pending += buf[pos:]
        return packets

    def _parse_into(self, buf: bytes, packets: list[Packet]) -> int:
        end = len(buf)
        pos = 0
        self._need = 0
        max_size = self.max_packet_size
        append = packets.append
        while end - pos >= 2:
            first = buf[pos]
            length = buf[pos + 1]
            header = 2
            if length & 0x80:
                length, header = remaining_length(buf, pos, end)
                if not header:
                    return pos
            total = header + length
            if total > max_size:
                raise MqttProtocolError(PACKET_TOO_LARGE, f"packet of {total} bytes exceeds the maximum of {max_size}")
            if end - pos < total:
                self._need = total
                return pos
            start = pos + header
            stop = pos + total
            kind = first >> 4
            if kind == PUBLISH:
                append(self._publish(buf, start, stop, first, pos))
            elif first == 0x40 and length == 2:
                # PUBACK without reason code (3.1.1, and MQTT 5's usual short form): one per QoS 1
                # delivery, so parsed here rather than through ``_other`` and its helpers.
                packet_id = (buf[start] << 8) | buf[start + 1]
                if not packet_id:
                    raise MqttProtocolError(PROTOCOL_ERROR, "packet identifier 0")
                append(PubAck(packet_id, 0, {}))
            else:
                append(self._other(buf, start, stop, kind, first & 0x0F))
            pos = stop
        return pos

    def _publish(self, buf: bytes, pos: int, end: int, first: int, frame_start: int) -> Publish:
        qos = (first >> 1) & 3
        if qos == 3:
            raise MqttProtocolError(MALFORMED_PACKET, "PUBLISH with QoS 3")
        dup = (first & 8) != 0
        if dup and not qos:
            raise MqttProtocolError(MALFORMED_PACKET, "QoS 0 PUBLISH with DUP set")
        if end - pos < 2:
            raise MqttProtocolError(MALFORMED_PACKET, "truncated PUBLISH")
        tlen = (buf[pos] << 8) | buf[pos + 1]
        pos += 2
        if pos + tlen > end:
            raise MqttProtocolError(MALFORMED_PACKET, "topic runs past the packet")
        raw_topic = buf[pos : pos + tlen]
        topic = self._topics.get(raw_topic)
        if topic is None:
            topic = self._topic_name(raw_topic)
        pos += tlen
        packet_id = None
        if qos:
            if end - pos < 2:
                raise MqttProtocolError(MALFORMED_PACKET, "truncated packet identifier")
            packet_id = (buf[pos] << 8) | buf[pos + 1]
            if not packet_id:
                raise MqttProtocolError(PROTOCOL_ERROR, "packet identifier 0")
            pos += 2
        properties: Properties
        if self.protocol_level != MQTT_5:
            properties = {}
        elif pos < end and buf[pos] == 0:  # the common empty property block, without the general decoder
            properties = {}
            pos += 1
        else:
            properties, pos = decode_properties(buf, pos, end, props.PUBLISH, self.max_user_properties)
        return Publish(topic, buf[pos:end], qos, (first & 1) != 0, dup, packet_id, properties, buf[frame_start:end])

    def topic_name(self, raw: bytes) -> str:
        """The checked topic name of a PUBLISH's topic bytes (``_topic_name``, remembered); raises
        ``MqttProtocolError`` for a name no PUBLISH may carry. For the broker's short path, which frames
        PUBLISHes without this reader."""
        topic = self._topics.get(raw)
        return topic if topic is not None else self._topic_name(raw)

    def _topic_name(self, raw: bytes) -> str:
        """Decode and check a PUBLISH topic name (MQTT 5 3.3.2.1: UTF-8, no U+0000, no wildcards; empty
        is left to the caller, as it is valid with a topic alias) and remember it."""
        try:
            topic = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MqttProtocolError(MALFORMED_PACKET, "topic is not valid UTF-8") from None
        if "\x00" in topic:
            raise MqttProtocolError(MALFORMED_PACKET, "topic contains U+0000")
        if "+" in topic or "#" in topic:
            raise MqttProtocolError(TOPIC_NAME_INVALID, f"invalid topic name {topic!r}")
        self._check_levels(topic, "topic name")
        size = len(raw)
        if size <= MAX_CACHED_KEY_CHARS:
            topics = self._topics
            if len(topics) >= TOPIC_CACHE_SIZE or self._topic_bytes + size > TOPIC_CACHE_BYTES:
                topics.clear()
                self._topic_bytes = 0
            topics[raw] = topic
            self._topic_bytes += size
        return topic

    def _check_levels(self, topic: str, what: str) -> None:
        limit = self.max_topic_levels
        if limit is not None and topic.count("/") >= limit:
            raise MqttProtocolError(TOPIC_NAME_INVALID, f"{what} has more than {limit} levels")

    def _other(self, buf: bytes | bytearray, pos: int, end: int, kind: int, flags: int) -> Packet:
        if flags != _REQUIRED_FLAGS.get(kind, 0):
            raise MqttProtocolError(MALFORMED_PACKET, f"reserved flags 0x{flags:X} in packet type {kind}")
        v5 = self.protocol_level == MQTT_5
        ack = _ACKS.get(kind)  # one dict probe: the hot path (a tuple of globals is rebuilt per call)
        if ack is not None:
            packet_id, pos = _packet_id(buf, pos, end)
            reason = 0
            properties: Properties = {}
            if v5:
                if pos < end:
                    reason = buf[pos]
                    pos += 1
                if pos < end:
                    properties, pos = decode_properties(buf, pos, end, kind, self.max_user_properties)
            _expect_end(pos, end)
            return ack(packet_id, reason, properties)
        if kind in (PINGREQ, PINGRESP):
            _expect_end(pos, end)
            return PingReq() if kind == PINGREQ else PingResp()
        if kind == CONNECT:
            return self._connect(buf, pos, end)
        if kind == SUBSCRIBE:
            return self._subscribe(buf, pos, end, v5)
        if kind == UNSUBSCRIBE:
            packet_id, pos = _packet_id(buf, pos, end)
            properties = {}
            if v5:
                properties, pos = decode_properties(buf, pos, end, UNSUBSCRIBE, self.max_user_properties)
            filters: list[str] = []
            while pos < end:
                topic_filter, pos = decode_utf8(buf, pos, end)
                filters.append(topic_filter)
                _check_filter_count(len(filters))
            if not filters:
                raise MqttProtocolError(PROTOCOL_ERROR, "UNSUBSCRIBE without topic filters")
            return Unsubscribe(packet_id, filters, properties)
        if kind in (DISCONNECT, AUTH):
            if kind == AUTH and not v5:
                raise MqttProtocolError(MALFORMED_PACKET, "AUTH packet in MQTT 3.1.1")
            reason = 0
            properties = {}
            if v5 and pos < end:
                reason = buf[pos]
                pos += 1
                if pos < end:
                    properties, pos = decode_properties(buf, pos, end, kind, self.max_user_properties)
            _expect_end(pos, end)
            return Disconnect(reason, properties) if kind == DISCONNECT else Auth(reason, properties)
        if kind == CONNACK:
            if end - pos < 2:
                raise MqttProtocolError(MALFORMED_PACKET, "truncated CONNACK")
            if buf[pos] & 0xFE:
                raise MqttProtocolError(MALFORMED_PACKET, "reserved CONNACK flags")
            session_present = bool(buf[pos] & 1)
            code = buf[pos + 1]
            pos += 2
            properties = {}
            if v5:
                if pos < end:
                    properties, pos = decode_properties(buf, pos, end, CONNACK, self.max_user_properties)
            else:
                if code not in V311_CONNACK_REASONS:
                    raise MqttProtocolError(MALFORMED_PACKET, f"unknown CONNACK return code {code}")
                code = V311_CONNACK_REASONS[code]
            _expect_end(pos, end)
            return Connack(session_present, code, properties)
        if kind in (SUBACK, UNSUBACK):
            packet_id, pos = _packet_id(buf, pos, end)
            properties = {}
            if v5:
                properties, pos = decode_properties(buf, pos, end, kind, self.max_user_properties)
            codes = list(buf[pos:end])
            if not v5 and kind == UNSUBACK:
                if codes:
                    raise MqttProtocolError(MALFORMED_PACKET, "MQTT 3.1.1 UNSUBACK with a payload")
            elif not codes:
                # One reason code per topic filter, and a (UN)SUBSCRIBE has at least one (MQTT 5 3.9.3, 3.11.3).
                raise MqttProtocolError(PROTOCOL_ERROR, "acknowledgement without reason codes")
            if kind == SUBACK:
                return Suback(packet_id, codes, properties)
            return Unsuback(packet_id, codes, properties)
        raise MqttProtocolError(MALFORMED_PACKET, f"reserved packet type {kind}")

    def _connect(self, buf: bytes | bytearray, pos: int, end: int) -> Connect:
        name, pos = decode_utf8(buf, pos, end)
        if end - pos < 4:
            raise MqttProtocolError(MALFORMED_PACKET, "truncated CONNECT")
        level = buf[pos]
        flags = buf[pos + 1]
        keep_alive = (buf[pos + 2] << 8) | buf[pos + 3]
        pos += 4
        if (name, level) not in (("MQTT", 4), ("MQTT", 5), ("MQIsdp", 3)):
            if name not in ("MQTT", "MQIsdp"):
                raise MqttProtocolError(MALFORMED_PACKET, f"unknown protocol name {name!r}")
            raise MqttProtocolError(UNSUPPORTED_PROTOCOL_VERSION, f"unsupported protocol level {level}")
        if flags & 1:
            raise MqttProtocolError(MALFORMED_PACKET, "reserved CONNECT flag set")
        v5 = level == MQTT_5
        self.protocol_level = MQTT_5 if v5 else MQTT_311
        will_flag = bool(flags & 0x04)
        will_qos = (flags >> 3) & 3
        will_retain = bool(flags & 0x20)
        if will_qos == 3 or (not will_flag and (will_qos or will_retain)):
            raise MqttProtocolError(MALFORMED_PACKET, "invalid will flags")
        if not v5 and flags & 0x40 and not flags & 0x80:
            raise MqttProtocolError(MALFORMED_PACKET, "password without user name")
        properties: Properties = {}
        if v5:
            properties, pos = decode_properties(buf, pos, end, props.CONNECT, self.max_user_properties)
        client_id, pos = decode_utf8(buf, pos, end)
        will = None
        if will_flag:
            will_properties: Properties = {}
            if v5:
                will_properties, pos = decode_properties(buf, pos, end, props.WILL, self.max_user_properties)
            will_topic, pos = decode_utf8(buf, pos, end)
            if not will_topic or "+" in will_topic or "#" in will_topic:
                # A will is published as it stands: a filter there would reach subscribers as a topic
                # name no PUBLISH may carry (mosquitto refuses such a CONNECT too).
                raise MqttProtocolError(TOPIC_NAME_INVALID, f"invalid will topic {will_topic!r}")
            self._check_levels(will_topic, "will topic")
            will_payload, pos = decode_binary(buf, pos, end)
            will = Will(will_topic, will_payload, will_qos, will_retain, will_properties)
        username = None
        password = None
        if flags & 0x80:
            username, pos = decode_utf8(buf, pos, end)
        if flags & 0x40:
            password, pos = decode_binary(buf, pos, end)
        _expect_end(pos, end)
        return Connect(level, client_id, bool(flags & 0x02), keep_alive, username, password, will, properties, name)

    def _subscribe(self, buf: bytes | bytearray, pos: int, end: int, v5: bool) -> Subscribe:
        packet_id, pos = _packet_id(buf, pos, end)
        properties: Properties = {}
        if v5:
            properties, pos = decode_properties(buf, pos, end, SUBSCRIBE, self.max_user_properties)
            if len(properties.get(props.SUBSCRIPTION_IDENTIFIER, ())) > 1:
                raise MqttProtocolError(PROTOCOL_ERROR, "more than one subscription identifier")
        requests: list[SubscribeRequest] = []
        while pos < end:
            topic_filter, pos = decode_utf8(buf, pos, end)
            if pos >= end:
                raise MqttProtocolError(MALFORMED_PACKET, "topic filter without options")
            options = buf[pos]
            pos += 1
            qos = options & 3
            if qos == 3:
                raise MqttProtocolError(MALFORMED_PACKET, "subscription with QoS 3")
            if v5:
                retain_handling = (options >> 4) & 3
                if options & 0xC0 or retain_handling == 3:
                    raise MqttProtocolError(MALFORMED_PACKET, "reserved subscription option bits")
                requests.append(
                    SubscribeRequest(topic_filter, qos, bool(options & 4), bool(options & 8), retain_handling)
                )
            else:
                if options & 0xFC:
                    raise MqttProtocolError(MALFORMED_PACKET, "reserved subscription option bits")
                requests.append(SubscribeRequest(topic_filter, qos))
            _check_filter_count(len(requests))
        if not requests:
            raise MqttProtocolError(PROTOCOL_ERROR, "SUBSCRIBE without topic filters")
        return Subscribe(packet_id, requests, properties)


_ACKS: dict[int, type[PubAck | PubRec | PubRel | PubComp]] = {PUBACK: PubAck, PUBREC: PubRec, PUBREL: PubRel, PUBCOMP: PubComp}


def _check_filter_count(count: int) -> None:
    if count > MAX_FILTERS_PER_PACKET:
        raise MqttProtocolError(QUOTA_EXCEEDED, f"more than {MAX_FILTERS_PER_PACKET} topic filters in one packet")


def _packet_id(buf: bytes | bytearray, pos: int, end: int) -> tuple[int, int]:
    if end - pos < 2:
        raise MqttProtocolError(MALFORMED_PACKET, "truncated packet identifier")
    packet_id = (buf[pos] << 8) | buf[pos + 1]
    if not packet_id:
        raise MqttProtocolError(PROTOCOL_ERROR, "packet identifier 0")
    return packet_id, pos + 2


def _expect_end(pos: int, end: int) -> None:
    if pos != end:
        raise MqttProtocolError(MALFORMED_PACKET, "trailing bytes after the packet")
