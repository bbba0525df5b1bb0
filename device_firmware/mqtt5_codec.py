"""MQTT 5 packets to and from byte buffers, with no I/O (sans-I/O, like h11).

Why this shape: on a 64 KB heap, per-packet allocation fragments memory. `Packer` writes every
outgoing packet into one preallocated buffer (the body first, then the fixed header in front of it,
so no second pass) and `Framer` frames incoming packets inside one preallocated receive buffer,
whatever way the socket split them. Payloads are never copied: `decode_publish` returns a
memoryview into the receive buffer, and a packet larger than the buffer is not an error but an
`Oversized` payload: its head (topic, packet id, properties) is decoded from the buffer and the
rest is skipped as it arrives, so a big message costs no heap and the caller still learns who sent
what and how large it was. `mqtt5.py` is the thin socket layer around these.
"""

import struct
from micropython import const

# Packet types (high nibble of the first byte).
_CONNECT = const(1)
CONNACK = const(2)
PUBLISH = const(3)
PUBACK = const(4)
_SUBSCRIBE = const(8)
SUBACK = const(9)
_PINGREQ = const(12)
PINGRESP = const(13)
DISCONNECT = const(14)

# Names used only here are private (`_X = const(...)`): the compiler then drops the name, which on
# a 64 KB heap matters, since every public name is a qstr for the rest of the run.
# Property identifiers (MQTT 5 section 2.2.2.2).
_PAYLOAD_FORMAT = const(0x01)
_MESSAGE_EXPIRY = const(0x02)
CONTENT_TYPE = const(0x03)
RESPONSE_TOPIC = const(0x08)
CORRELATION_DATA = const(0x09)
_SUBSCRIPTION_ID = const(0x0B)
SESSION_EXPIRY = const(0x11)
ASSIGNED_CLIENT_ID = const(0x12)
SERVER_KEEP_ALIVE = const(0x13)
REASON_STRING = const(0x1F)
RECEIVE_MAXIMUM = const(0x21)
_TOPIC_ALIAS_MAXIMUM = const(0x22)
_TOPIC_ALIAS = const(0x23)
USER_PROPERTY = const(0x26)
MAXIMUM_PACKET_SIZE = const(0x27)

# Wire type of every property id 0x00-0x2A (0x00 and gaps: not a property): B byte, H two-byte
# int, I four-byte int, V varint, S UTF-8 string, D binary data, P UTF-8 string pair.
# A bytes table, not a dict: a few dozen bytes of heap instead of a kilobyte.
_PROPERTY_KINDS = b"-BIS----SD-V-----ISH-SDBIBS-S--S-HHHBBPIBBB"


_B = const(0x42)
_H = const(0x48)
_I = const(0x49)
_V = const(0x56)
_S = const(0x53)
_D = const(0x44)
_P = const(0x50)


def _kind(pid: int):
    """The wire type of a property id (a letter's code: _B, _H ...), or None for an unknown id."""
    if pid >= len(_PROPERTY_KINDS) or _PROPERTY_KINDS[pid] == 0x2D:  # "-"
        return None
    return _PROPERTY_KINDS[pid]


_HEADER_ROOM = const(5)  # first byte + up to four bytes of remaining length


# MQTT 5 reason codes of what a receiver finds wrong, carried by MQTTProtocolError.
_MALFORMED = const(0x81)
_PROTOCOL_ERROR = const(0x82)
_TOPIC_NAME_INVALID = const(0x90)
_TOPIC_ALIAS_INVALID = const(0x94)


class MQTTProtocolError(ValueError):
    """The peer sent bytes that are not a valid MQTT 5 packet. `args[0]` is the MQTT 5 reason code
    (0x81 malformed packet, 0x82 protocol error, 0x90 topic name invalid, 0x94 topic alias invalid),
    as the broker codec reports it; a number, not a message, because each message string would stay
    on the heap for the whole run (a kilobyte for the codec's dozen)."""


class Oversized:
    """The payload of a PUBLISH larger than the receive buffer: `size` bytes on the wire, of which
    `head` (a memoryview, valid until the next read) is what fitted; the rest was skipped."""

    def __init__(self, size: int, head):
        self.size = size
        self.head = head


def _text(value) -> bytes:
    return value.encode() if isinstance(value, str) else value


def varint_size(n: int) -> int:
    if n < 128:
        return 1
    if n < 16384:
        return 2
    if n < 2097152:
        return 3
    if n < 268435456:
        return 4
    raise ValueError("varint out of range")


def put_varint(buf, pos: int, n: int) -> int:
    while True:
        byte = n & 0x7F
        n >>= 7
        buf[pos] = byte | 0x80 if n else byte
        pos += 1
        if not n:
            return pos


def get_varint(buf, pos: int, end: int):
    """(value, next position), or (None, pos) when the bytes stop before the varint does."""
    value = 0
    shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 21:
            raise MQTTProtocolError(_MALFORMED)
    return None, pos


def _put_bytes(buf, pos: int, data: bytes) -> int:
    n = len(data)
    struct.pack_into(">H", buf, pos, n)
    buf[pos + 2:pos + 2 + n] = data
    return pos + 2 + n


def props_size(props) -> int:
    """Bytes the properties take on the wire, without their own length prefix."""
    size = 0
    if not props:
        return 0
    for pid, value in props.items():
        kind = _kind(pid)
        if kind is None:
            raise ValueError("unknown property 0x%02x" % pid)
        if kind == _P:
            for name, val in value:
                size += 5 + len(_text(name)) + len(_text(val))
        elif kind == _S or kind == _D:
            size += 3 + len(_text(value))
        elif kind == _V:
            size += 1 + varint_size(value)
        else:
            size += 2 if kind == _B else 3 if kind == _H else 5
    return size


def put_props(buf, pos: int, props, size: int) -> int:
    pos = put_varint(buf, pos, size)
    if not props:
        return pos
    for pid, value in props.items():
        kind = _kind(pid)
        if kind == _P:
            for name, val in value:
                buf[pos] = pid
                pos = _put_bytes(buf, _put_bytes(buf, pos + 1, _text(name)), _text(val))
            continue
        buf[pos] = pid
        pos += 1
        if kind == _S or kind == _D:
            pos = _put_bytes(buf, pos, _text(value))
        elif kind == _V:
            pos = put_varint(buf, pos, value)
        elif kind == _B:
            buf[pos] = value
            pos += 1
        elif kind == _H:
            struct.pack_into(">H", buf, pos, value)
            pos += 2
        else:
            struct.pack_into(">I", buf, pos, value)
            pos += 4
    return pos


def get_props(mv, pos: int, end: int):
    """Decode a property block at pos: (dict, next position). User properties are a list of pairs,
    subscription identifiers a list of ints (a PUBLISH carries one per matching subscription); any
    other property given twice is a protocol error (MQTT 5 section 2.2.2.2)."""
    length, pos = get_varint(mv, pos, end)
    if length is None or pos + length > end:
        raise MQTTProtocolError(_MALFORMED)
    stop = pos + length
    props = {}
    while pos < stop:
        pid = mv[pos]
        kind = _kind(pid)
        if kind is None:
            raise MQTTProtocolError(_MALFORMED)
        pos += 1
        if kind == _B:
            value = mv[pos]
            pos += 1
        elif kind == _H:
            value = struct.unpack_from(">H", mv, pos)[0]
            pos += 2
        elif kind == _I:
            value = struct.unpack_from(">I", mv, pos)[0]
            pos += 4
        elif kind == _V:
            value, pos = get_varint(mv, pos, stop)
        elif kind == _P:
            name, pos = get_string(mv, pos, stop)
            value, pos = get_string(mv, pos, stop)
            value = (name, value)
        else:
            value, pos = get_binary(mv, pos, stop)
            if kind == _S:
                value = _utf8(value)
        repeats = kind == _P or pid == _SUBSCRIPTION_ID
        if value is None:  # a varint cut off by the block's end
            raise MQTTProtocolError(_MALFORMED)
        if pid in props and not repeats:
            raise MQTTProtocolError(_PROTOCOL_ERROR)
        if repeats:
            props.setdefault(pid, []).append(value)
        else:
            props[pid] = value
    if pos != stop:  # a fixed-size value read past the block's end (past the packet's is an IndexError)
        raise MQTTProtocolError(_MALFORMED)
    return props, stop


def get_binary(mv, pos: int, end: int):
    if pos + 2 > end:
        raise MQTTProtocolError(_MALFORMED)
    n = (mv[pos] << 8) | mv[pos + 1]
    pos += 2
    if pos + n > end:
        raise MQTTProtocolError(_MALFORMED)
    return bytes(mv[pos:pos + n]), pos + n


def _utf8(raw) -> str:
    """raw as text. Ill-formed UTF-8 (a UnicodeError, which decode_packet reports) and U+0000 make a
    packet malformed (1.5.4); MicroPython's decoder lets overlong forms and surrogates pass."""
    if 0 in raw:
        raise MQTTProtocolError(_MALFORMED)
    return raw.decode()


def get_string(mv, pos: int, end: int):
    value, pos = get_binary(mv, pos, end)
    return _utf8(value), pos


def _get_pid(body, pos: int) -> int:
    """A packet identifier; 0 is not one (2.2.1)."""
    pid = (body[pos] << 8) | body[pos + 1]
    if not pid:
        raise MQTTProtocolError(_PROTOCOL_ERROR)
    return pid


def _props_to_end(body, pos: int):
    """The property block that ends the packet: nothing may follow it."""
    props, pos = get_props(body, pos, len(body))
    if pos != len(body):
        raise MQTTProtocolError(_MALFORMED)
    return props


class Packer:
    """Builds outgoing packets in one preallocated buffer.

    Each method returns a memoryview of the finished packet, valid until the next call.
    A packet that does not fit raises ValueError before anything is written.
    """

    def __init__(self, size: int):
        self.buf = bytearray(size)
        self.mv = memoryview(self.buf)

    def _body_fits(self, size: int) -> None:
        if _HEADER_ROOM + size > len(self.buf):
            raise ValueError("packet of %d bytes exceeds the %d byte send buffer" % (size, len(self.buf)))

    def _finish(self, first_byte: int, end: int):
        """Write the fixed header just in front of the body that starts at _HEADER_ROOM."""
        length = end - _HEADER_ROOM
        start = _HEADER_ROOM - 1 - varint_size(length)
        self.buf[start] = first_byte
        put_varint(self.buf, start + 1, length)
        return self.mv[start:end]

    def connect(self, client_id, keepalive: int, clean_session: bool, props=None,
                user=None, password=None):
        """No will: a thermostat's absence shows in its telemetry, and the code would cost heap."""
        client_id = _text(client_id)
        psize = props_size(props)
        size = 10 + varint_size(psize) + psize + 2 + len(client_id)
        flags = 0x02 if clean_session else 0
        if user is not None:
            size += 2 + len(_text(user))
            flags |= 0x80
        if password is not None:
            size += 2 + len(_text(password))
            flags |= 0x40
        self._body_fits(size)
        buf = self.buf
        pos = _put_bytes(buf, _HEADER_ROOM, b"MQTT")
        struct.pack_into(">BBH", buf, pos, 5, flags, keepalive)
        pos = put_props(buf, pos + 4, props, psize)
        pos = _put_bytes(buf, pos, client_id)
        if user is not None:
            pos = _put_bytes(buf, pos, _text(user))
        if password is not None:
            pos = _put_bytes(buf, pos, _text(password))
        return self._finish(_CONNECT << 4, pos)

    def publish(self, topic, payload, qos: int, retain: bool, pid: int, props=None):
        topic = _text(topic)
        psize = props_size(props)
        size = 2 + len(topic) + (2 if qos else 0) + varint_size(psize) + psize + len(payload)
        self._body_fits(size)
        buf = self.buf
        pos = _put_bytes(buf, _HEADER_ROOM, topic)
        if qos:
            struct.pack_into(">H", buf, pos, pid)
            pos += 2
        pos = put_props(buf, pos, props, psize)
        buf[pos:pos + len(payload)] = payload
        first = (PUBLISH << 4) | (qos << 1) | (0x01 if retain else 0)
        return self._finish(first, pos + len(payload))

    def puback(self, pid: int, reason: int = 0):
        struct.pack_into(">HB", self.buf, _HEADER_ROOM, pid, reason)
        # Reason 0 with no properties may be shortened to the packet id alone (3.4.2.1).
        return self._finish(PUBACK << 4, _HEADER_ROOM + (2 if reason == 0 else 3))

    def subscribe(self, pid: int, topic, qos: int, props=None):
        topic = _text(topic)
        psize = props_size(props)
        self._body_fits(2 + varint_size(psize) + psize + 3 + len(topic))
        buf = self.buf
        struct.pack_into(">H", buf, _HEADER_ROOM, pid)
        pos = put_props(buf, _HEADER_ROOM + 2, props, psize)
        pos = _put_bytes(buf, pos, topic)
        buf[pos] = qos  # subscription options: QoS only (no-local, retain flags left at 0)
        return self._finish((_SUBSCRIBE << 4) | 0x02, pos + 1)

    def pingreq(self):
        return self._finish(_PINGREQ << 4, _HEADER_ROOM)

    def disconnect(self, reason: int = 0):
        # Reason 0 with no properties is sent as an empty body (3.14.2.1), as the broker sends it.
        self.buf[_HEADER_ROOM] = reason
        return self._finish(DISCONNECT << 4, _HEADER_ROOM + (1 if reason else 0))


class Framer:
    """Frames incoming packets inside one preallocated receive buffer.

    The socket layer reads into `space()` and reports how much it read with `added(n)`;
    `next_packet()` then returns whole packets. The body view it returns is valid until the
    next `space()` call, which compacts the buffer. A packet longer than the buffer comes out
    once the buffer is full, as its head (the view is then shorter than the length it reports);
    its remaining bytes are dropped by `added()` as they arrive.
    """

    def __init__(self, size: int):
        self.buf = bytearray(size)
        self.mv = memoryview(self.buf)
        self.start = 0
        self.end = 0
        self.skip = 0  # bytes of an oversized packet still to drop

    def reset(self) -> None:
        self.start = self.end = self.skip = 0

    def space(self):
        if self.start:
            left = self.end - self.start
            self.buf[0:left] = self.mv[self.start:self.end]
            self.start, self.end = 0, left
        return self.mv[self.end:]

    def added(self, n: int) -> None:
        if self.skip:
            drop = min(n, self.skip)
            self.skip -= drop
            if drop < n:  # the next packet starts inside this read: move it down over the dropped bytes
                self.buf[self.end:self.end + n - drop] = self.mv[self.end + drop:self.end + n]
            n -= drop
        self.end += n

    def next_packet(self):
        """(packet type, flags, body memoryview, body length) for the next packet, or None if
        incomplete. `len(body) < length` means an oversized packet: body is its head."""
        if self.end - self.start < 2:
            return None
        length, body = get_varint(self.buf, self.start + 1, self.end)
        if length is None:
            return None
        first = self.buf[self.start]
        if body + length <= self.end:
            self.start = body + length
            return first >> 4, first & 0x0F, self.mv[body:body + length], length
        if body - self.start + length <= len(self.buf) or self.start or self.end < len(self.buf):
            return None  # it will fit once compacted, or more of its head is still to come
        self.skip = body + length - self.end
        self.start = self.end = 0
        return first >> 4, first & 0x0F, self.mv[body:len(self.buf)], length


# Decoders for the packets a client receives. Each takes the body view from Framer.

def decode_packet(kind: int, flags: int, body, length: int):
    """Any packet a client receives, from `Framer.next_packet()`'s parts: what the decoder of its
    type returns (`()` for PINGRESP). Anything wrong is an MQTTProtocolError: a type a client never
    receives, reserved flags set (all types but PUBLISH have them 0 here: 2.1.3), and whatever the
    decoders find, including reads past a short packet and ill-formed UTF-8 (so they need no checks
    of their own for those)."""
    try:
        if kind == PUBLISH:
            return decode_publish(flags, body, length)
        if not flags:
            if kind == CONNACK:
                return decode_connack(body)
            if kind == PUBACK:
                return decode_puback(body)
            if kind == SUBACK:
                return decode_suback(body)
            if kind == DISCONNECT:
                return decode_disconnect(body)
            if kind == PINGRESP and not len(body):
                return ()
    except MQTTProtocolError:
        raise
    except (ValueError, IndexError):  # read past a short packet, ill-formed UTF-8, a bad struct
        raise MQTTProtocolError(_MALFORMED)
    # Reserved flags, a PINGRESP with a body, reserved type 0: malformed; a type we never receive: out of turn.
    raise MQTTProtocolError(_PROTOCOL_ERROR if kind and not flags and kind != PINGRESP else _MALFORMED)


def decode_connack(body):
    """(session present, reason code, properties)."""
    if body[0] & 0xFE:
        raise MQTTProtocolError(_MALFORMED)
    props = _props_to_end(body, 2) if len(body) > 2 else {}
    return bool(body[0] & 1), body[1], props


def decode_publish(flags: int, body, length=None):
    """(topic bytes, payload, qos, packet id, retain, properties). The payload is a memoryview
    into body (no copy), or `Oversized` when body is only the head of a `length`-byte packet.
    The topic stays bytes, but must be a topic name: UTF-8, no wildcards (3.3.2.1). We grant no
    topic aliases (Topic Alias Maximum 0 by omission), so one received is an error (3.3.2.3.4)."""
    qos = (flags >> 1) & 3
    if qos == 3 or flags & 8 and not qos:
        raise MQTTProtocolError(_MALFORMED)
    end = len(body)
    topic, pos = get_binary(body, 0, end)
    _utf8(topic)
    if 0x23 in topic or 0x2B in topic:  # '#', '+'
        raise MQTTProtocolError(_TOPIC_NAME_INVALID)
    pid = 0
    if qos:
        pid = _get_pid(body, pos)
        pos += 2
    props, pos = get_props(body, pos, end)
    if _TOPIC_ALIAS in props:
        raise MQTTProtocolError(_TOPIC_ALIAS_INVALID)
    if length is not None and length > end:
        payload = Oversized(length - pos, body[pos:])
    else:
        payload = body[pos:]
    return topic, payload, qos, pid, bool(flags & 1), props


def decode_puback(body):
    """(packet id, reason code, properties); a two-byte PUBACK means success (3.4.2.1)."""
    pid = _get_pid(body, 0)
    if len(body) == 2:
        return pid, 0, {}
    props = _props_to_end(body, 3) if len(body) > 3 else {}
    return pid, body[2], props


def decode_suback(body):
    """(packet id, list of reason codes, properties): at least one code, as a SUBSCRIBE has at
    least one topic filter (3.9.3)."""
    pid = _get_pid(body, 0)
    props, pos = get_props(body, 2, len(body))
    if pos == len(body):
        raise MQTTProtocolError(_PROTOCOL_ERROR)
    return pid, list(body[pos:]), props


def decode_disconnect(body):
    """(reason code, properties); an empty body means normal disconnection."""
    if not len(body):
        return 0, {}
    props = _props_to_end(body, 1) if len(body) > 1 else {}
    return body[0], props
