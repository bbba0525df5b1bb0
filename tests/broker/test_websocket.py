"""The WebSocket layer on its own: RFC 6455's handshake example, the version check, masking, control
frames, continuation rules, text frames, and hostile bytes after the handshake."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.transport.websocket import WebSocketServer
from testing.campaigns import campaign

OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA

HANDSHAKE = (
    b"GET /mqtt HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: mqtt\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def client_frame(payload: bytes, opcode: int = OP_BINARY, final: bool = True) -> bytes:
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    first = (0x80 if final else 0) | opcode
    length = len(payload)
    if length < 126:
        head = bytes((first, 0x80 | length))
    elif length < 65536:
        head = struct.pack(">BBH", first, 0x80 | 126, length)
    else:
        head = struct.pack(">BBQ", first, 0x80 | 127, length)
    return head + mask + masked


def server_frame(payload: bytes, opcode: int) -> bytes:
    assert len(payload) < 126
    return bytes((0x80 | opcode, len(payload))) + payload


def opened() -> WebSocketServer:
    server = WebSocketServer()
    data, reply = server.receive(HANDSHAKE)
    assert data == b"" and reply.startswith(b"HTTP/1.1 101 ")
    return server


def close_code(reply: bytes) -> int:
    assert reply[0] == 0x80 | OP_CLOSE, reply
    return int(struct.unpack_from(">H", reply, 2)[0])


def test_handshake_answers_with_the_rfc_accept_value_and_the_mqtt_subprotocol() -> None:
    server = WebSocketServer()
    assert server.receive(HANDSHAKE[:30]) == (b"", b"")  # incomplete request: wait
    data, reply = server.receive(HANDSHAKE[30:])
    assert reply.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in reply
    assert b"Sec-WebSocket-Protocol: mqtt\r\n" in reply
    assert not server.closed


def test_binary_frames_of_any_size_and_split_anywhere_become_one_byte_stream() -> None:
    server = opened()
    wire = client_frame(b"a" * 10) + client_frame(b"b" * 300, final=False) + client_frame(b"c" * 70000, 0)
    out = b""
    for start in range(0, len(wire), 997):
        data, reply = server.receive(wire[start : start + 997])
        assert reply == b""
        out += data
    assert out == b"a" * 10 + b"b" * 300 + b"c" * 70000


def test_a_ping_between_fragments_gets_its_pong_and_a_close_is_answered() -> None:
    server = opened()
    wire = client_frame(b"ab", final=False) + client_frame(b"hi", OP_PING) + client_frame(b"cd", OP_CONTINUATION)
    data, reply = server.receive(wire + client_frame(b"\x03\xe8", OP_CLOSE))
    assert data == b"abcd"
    assert reply == server_frame(b"hi", OP_PONG) + server_frame(b"\x03\xe8", OP_CLOSE)
    assert server.closed and server.failure is None
    assert server.receive(client_frame(b"late")) == (b"", b"")  # nothing after the close


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (client_frame(b"text", OP_TEXT), 1003),  # MQTT 5 section 6.0: binary frames only
        (bytes((0x82, 4)) + b"abcd", 1002),  # unmasked client frame
        (client_frame(b"x" * 126, OP_PING), 1002),  # control frame over 125 bytes
        (client_frame(b"x", OP_PING, final=False), 1002),  # fragmented control frame
        (client_frame(b"x", OP_CONTINUATION), 1002),  # continuation with nothing to continue
        (client_frame(b"a", final=False) + client_frame(b"b"), 1002),  # new message inside a fragmented one
        (client_frame(b"x", 0x3), 1002),  # reserved opcode
        (bytes((0xC2, 0x80)) + os.urandom(4), 1002),  # RSV1 set, no extension negotiated
    ],
    ids=["text", "unmasked", "big-ping", "fragmented-ping", "lone-continuation", "interleaved", "reserved-op", "rsv1"],
)
def test_bad_frames_close_with_the_rfc_code_and_a_reason(wire: bytes, code: int) -> None:
    server = opened()
    data, reply = server.receive(wire)
    assert close_code(reply) == code
    assert server.closed and server.failure


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
        (HANDSHAKE.replace(b"Version: 13", b"Version: 8"), b"426"),
        (b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00" + b"\r\n\r\n", b"400"),  # plain MQTT on the port
    ],
    ids=["not-upgrade", "old-version", "mqtt-bytes"],
)
def test_a_bad_opening_handshake_is_refused_with_its_http_status(request_bytes: bytes, status: bytes) -> None:
    server = WebSocketServer()
    data, reply = server.receive(request_bytes)
    assert data == b"" and reply.startswith(b"HTTP/1.1 " + status)
    assert server.closed and server.failure


def test_server_frames_use_the_right_length_encoding() -> None:
    server = opened()
    assert server.send(b"x" * 5)[:2] == b"\x82\x05"
    assert server.send(b"x" * 200)[:4] == b"\x82\x7e\x00\xc8"
    assert server.send(b"x" * 70000)[:2] == b"\x82\x7f"


@campaign(300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8))
def test_hostile_bytes_after_the_handshake_never_raise(reads: list[bytes]) -> None:
    server = opened()
    for chunk in reads:
        data, reply = server.receive(chunk)
        assert len(data) <= len(chunk)  # payload is handed on as it comes, never held back and grown
        if server.closed:
            assert server.receive(chunk) == (b"", b"")


def test_an_opening_handshake_that_never_ends_is_refused_within_a_bound() -> None:
    server = WebSocketServer()
    sent = 0
    while not server.closed:
        data, reply = server.receive(b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * 4000)
        sent += 4000
        assert sent <= 32_000, "the handshake buffer grows without bound"
    assert reply.startswith(b"HTTP/1.1 400")


@campaign(200, deadline=None)
@given(st.binary(max_size=600))
def test_hostile_opening_handshakes_never_raise(request_bytes: bytes) -> None:
    server = WebSocketServer()
    data, reply = server.receive(request_bytes)
    assert data == b""
    if server.closed:
        assert reply.startswith(b"HTTP/1.1 4")
