"""RESP3, the state store's payload format: encode requests, decode replies (no I/O).

The decoder is strict and total: anything it cannot account for byte by byte raises
`ValueError`, so a damaged reply is never mistaken for a value. Its rules are the gateway's
(docs/statestore.md; tests/conformance holds both to the same vectors): no leading zeros or `-0`,
integers within a signed 64-bit integer, no CR or LF inside a line, arrays nested 8 deep at most
(deeper would recurse towards a small board's stack limit). `-ERR ...` replies are
returned as `Resp3Error` values, not raised: the caller decides what an error means.

It decodes in place: given a memoryview (the MQTT receive buffer) it returns bulk strings as
memoryview slices of it, so a large value costs no heap; given bytes it returns bytes. With
`partial=True` it reads the head of a message that did not fit the receive buffer: a bulk string
cut off there comes back as `TooLong(size)`, which is all a thermostat needs to say why it refuses it.
"""

from micropython import const


class Resp3Error(Exception):
    """An error reply; `str()` is the text after `-ERR `."""


class TooLong:
    """A bulk string of `size` bytes that was not kept (it did not fit, or is longer than wanted)."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


_MAX_LINE = const(256)  # a simple string, error or length line longer than this is not one we can use
_MAX_DEPTH = const(8)


def encode_command(*args) -> bytes:
    """`encode_command("GET", key)` -> `*2\\r\\n$3\\r\\nGET\\r\\n$..`; args are str or bytes."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else bytes(arg)
        parts.append(b"$%d\r\n" % len(data))
        parts.append(data)
        parts.append(b"\r\n")
    return b"".join(parts)


def _line(buf, pos: int):
    """(bytes of the line at pos, position after its CRLF); works on memoryviews (no .find)."""
    end = pos
    stop = min(len(buf) - 1, pos + _MAX_LINE)
    while end < stop:
        if buf[end] == 13 and buf[end + 1] == 10:
            return bytes(buf[pos:end]), end + 2
        if buf[end] == 13 or buf[end] == 10:
            raise ValueError("RESP3: CR or LF inside a line")
        end += 1
    raise ValueError("RESP3: missing CRLF")


def _number(text: bytes) -> int:
    negative = text[:1] == b"-"
    digits = text[1:] if negative else text
    if (not digits or not digits.isdigit() or len(digits) > 19 or (digits[0] == 0x30 and len(digits) > 1)
            or text == b"-0"):
        raise ValueError("RESP3: bad integer %r" % text)
    # Same-length digit strings compare like their numbers, so no big integer is needed to bound one.
    if len(digits) == 19 and digits > (b"9223372036854775808" if negative else b"9223372036854775807"):
        raise ValueError("RESP3: integer overflow")
    return int(text)


def _value(buf, pos: int, partial: bool, depth: int = 0):
    if pos >= len(buf):
        raise ValueError("RESP3: truncated")
    kind = buf[pos]
    line, pos = _line(buf, pos + 1)
    if kind == 0x2B:  # +
        return line.decode(), pos
    if kind == 0x2D:  # -
        text = line.decode()
        for prefix in ("ERR: ", "ERR "):
            if text.startswith(prefix):
                text = text[len(prefix):]
                break
        return Resp3Error(text), pos
    if kind == 0x3A:  # :
        return _number(line), pos
    if kind == 0x5F:  # _
        if line:
            raise ValueError("RESP3: bad null")
        return None, pos
    if kind == 0x24:  # $
        n = _number(line)
        if n == -1:
            return None, pos
        if n < 0:
            raise ValueError("RESP3: bad bulk string length")
        if partial and pos + n + 2 > len(buf):
            return TooLong(n), len(buf)
        if pos + n + 2 > len(buf) or buf[pos + n] != 13 or buf[pos + n + 1] != 10:
            raise ValueError("RESP3: bulk string length mismatch")
        return buf[pos:pos + n], pos + n + 2
    if kind == 0x2A:  # *
        n = _number(line)
        if n == -1:
            return None, pos
        if n < 0:
            raise ValueError("RESP3: negative array length")
        if depth >= _MAX_DEPTH:
            raise ValueError("RESP3: arrays nested too deeply")
        items = []
        for _ in range(n):
            if partial and pos >= len(buf):
                break
            item, pos = _value(buf, pos, partial, depth + 1)
            items.append(item)
        return items, pos
    raise ValueError("RESP3: unknown type %r" % chr(kind))


def decode(payload, partial: bool = False):
    """One whole RESP3 value: str, int, bulk string (same type as payload), None, list or Resp3Error.
    partial: payload is only the head of a longer message (see TooLong)."""
    value, pos = _value(payload, 0, partial)
    if pos != len(payload):
        raise ValueError("RESP3: trailing bytes")
    return value
