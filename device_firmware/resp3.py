"""RESP3, the state store's payload format: encode requests, decode replies (no I/O).

The decoder is strict and total: anything it cannot account for byte by byte raises
`ValueError`, so a damaged reply is never mistaken for a value. `-ERR ...` replies are
returned as `Resp3Error` values, not raised: the caller decides what an error means.
"""


class Resp3Error(Exception):
    """An error reply; `str()` is the text after `-ERR `."""


def _arg(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def encode_command(*args) -> bytes:
    """`encode_command("GET", key)` -> `*2\\r\\n$3\\r\\nGET\\r\\n$..`; args are str or bytes."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = _arg(arg)
        parts.append(b"$%d\r\n" % len(data))
        parts.append(data)
        parts.append(b"\r\n")
    return b"".join(parts)


def _line(buf, pos: int):
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise ValueError("RESP3: missing CRLF")
    return buf[pos:end], end + 2


def _number(text: bytes) -> int:
    digits = text[1:] if text[:1] == b"-" else text
    if not digits or not digits.isdigit():
        raise ValueError("RESP3: bad integer %r" % text)
    return int(text)


def _value(buf, pos: int):
    if pos >= len(buf):
        raise ValueError("RESP3: truncated")
    kind = buf[pos:pos + 1]
    line, pos = _line(buf, pos + 1)
    if kind == b"+":
        return line.decode(), pos
    if kind == b"-":
        text = line.decode()
        for prefix in ("ERR: ", "ERR "):
            if text.startswith(prefix):
                text = text[len(prefix):]
                break
        return Resp3Error(text), pos
    if kind == b":":
        return _number(line), pos
    if kind == b"_":
        if line:
            raise ValueError("RESP3: bad null")
        return None, pos
    if kind == b"$":
        n = _number(line)
        if n == -1:
            return None, pos
        if n < 0 or buf[pos + n:pos + n + 2] != b"\r\n":
            raise ValueError("RESP3: bulk string length mismatch")
        return buf[pos:pos + n], pos + n + 2
    if kind == b"*":
        n = _number(line)
        if n == -1:
            return None, pos
        if n < 0:
            raise ValueError("RESP3: negative array length")
        items = []
        for _ in range(n):
            item, pos = _value(buf, pos)
            items.append(item)
        return items, pos
    raise ValueError("RESP3: unknown type %r" % kind)


def decode(payload: bytes):
    """One whole RESP3 value: str, int, bytes, None, list or Resp3Error."""
    value, pos = _value(bytes(payload), 0)
    if pos != len(payload):
        raise ValueError("RESP3: trailing bytes")
    return value
