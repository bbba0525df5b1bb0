"""RESP3, the subset the state store speaks: a strict, total decoder and the encoders for replies.

Why strict and total: every request payload comes from the network, so ``decode`` must return a value or
raise ``Resp3Error`` for *any* byte string - never an IndexError, never a partial value, never a silently
ignored trailing byte. One payload is one MQTT message, so there is no streaming: the whole payload must be
exactly one RESP3 value.

Strictness choices (documented in docs/statestore.md):

* lengths and integers are ASCII digits with an optional leading ``-``; no ``+``, no spaces, no leading
  zeros (``$03``), and within a signed 64-bit integer (RESP3's number; the protocol document lists
  "integer overflow" among the invalid payloads);
* the only negative length is ``-1`` (the RESP2 null), for ``$`` and ``*``; RESP3's own null is ``_``;
* every line ends in CRLF, and a bulk string's payload must be followed by CRLF exactly;
* nesting deeper than ``MAX_DEPTH`` is refused rather than recursed into.

No I/O, no asyncio: this module is imported by the service, the client and the tests alike.
"""

from __future__ import annotations

from dataclasses import dataclass

CRLF = b"\r\n"
MAX_DIGITS = 19
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 8


class Resp3Error(ValueError):
    """The bytes are not exactly one well-formed RESP3 value."""


@dataclass(frozen=True, slots=True)
class SimpleString:
    """``+OK``: a status reply, distinct from a bulk string that happens to hold the same bytes."""

    text: bytes


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """``-ERR syntax error``: ``text`` is everything after the ``-`` (so it starts with ``ERR``)."""

    text: bytes


# A decoded value: bulk strings are bytes, the RESP null is None, arrays are lists.
Value = SimpleString | ErrorReply | int | bytes | None | list["Value"]


def decode(data: bytes) -> Value:
    """Decode ``data`` as exactly one RESP3 value, or raise ``Resp3Error``."""
    value, end = _decode_at(bytes(data), 0, 0)
    if end != len(data):
        raise Resp3Error(f"{len(data) - end} trailing bytes after the value")
    return value


def _read_line(data: bytes, start: int) -> tuple[bytes, int]:
    end = data.find(CRLF, start)
    if end < 0:
        raise Resp3Error("line not terminated by CRLF")
    line = data[start:end]
    if b"\r" in line or b"\n" in line:
        raise Resp3Error("stray CR or LF inside a line")
    return line, end + 2


def _parse_integer(text: bytes) -> int:
    digits = text[1:] if text.startswith(b"-") else text
    if not digits or not digits.isdigit() or len(digits) > MAX_DIGITS:
        raise Resp3Error(f"not an integer: {text[:32]!r}")
    if len(digits) > 1 and digits.startswith(b"0"):
        raise Resp3Error(f"leading zero in integer: {text[:32]!r}")
    if text == b"-0":
        raise Resp3Error("negative zero")
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise Resp3Error(f"integer overflow: {text[:32]!r}")
    return value


def _decode_at(data: bytes, pos: int, depth: int) -> tuple[Value, int]:
    if pos >= len(data):
        raise Resp3Error("truncated: expected a value")
    marker = data[pos : pos + 1]
    line, after = _read_line(data, pos + 1)
    if marker == b"+":
        return SimpleString(line), after
    if marker == b"-":
        return ErrorReply(line), after
    if marker == b":":
        return _parse_integer(line), after
    if marker == b"_":
        if line:
            raise Resp3Error("null with content")
        return None, after
    if marker == b"$":
        length = _parse_integer(line)
        if length == -1:
            return None, after
        if length < 0:
            raise Resp3Error("negative bulk string length")
        end = after + length
        if end + 2 > len(data):
            raise Resp3Error("truncated bulk string")
        if data[end : end + 2] != CRLF:
            raise Resp3Error("bulk string length does not match its data")
        return data[after:end], end + 2
    if marker == b"*":
        count = _parse_integer(line)
        if count == -1:
            return None, after
        if count < 0:
            raise Resp3Error("negative array length")
        if depth >= MAX_DEPTH:
            raise Resp3Error("arrays nested too deeply")
        # Every element needs at least 4 bytes ("+\r\n" is 3, plus a marker), so a count larger than the
        # remaining bytes can be refused before looping over a huge, attacker-chosen number.
        if count > len(data) - after:
            raise Resp3Error("truncated array")
        items: list[Value] = []
        for _ in range(count):
            item, after = _decode_at(data, after, depth + 1)
            items.append(item)
        return items, after
    raise Resp3Error(f"unknown type marker {marker!r}")


def encode_simple(text: bytes) -> bytes:
    return b"+" + text + CRLF


def encode_error(message: str) -> bytes:
    """``-ERR <message>``: the form the SDK clients strip (``-ERR `` prefix, CRLF suffix)."""
    return b"-ERR " + message.encode("utf-8") + CRLF


def encode_integer(value: int) -> bytes:
    return b":" + str(value).encode("ascii") + CRLF


def encode_bulk(value: bytes | None) -> bytes:
    if value is None:
        return b"$-1" + CRLF
    return b"$" + str(len(value)).encode("ascii") + CRLF + value + CRLF


def encode_array(items: list[bytes]) -> bytes:
    """An array of bulk strings: what requests and notifications are made of."""
    return b"*" + str(len(items)).encode("ascii") + CRLF + b"".join(encode_bulk(item) for item in items)


OK = encode_simple(b"OK")
