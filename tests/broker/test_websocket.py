"""The WebSocket layer on its own: RFC 6455's handshake example, masking, control frames, bad frames."""

from __future__ import annotations

import os
import struct

import pytest

from appliance.broker.codec.reasons import PACKET_TOO_LARGE, PROTOCOL_ERROR, ProtocolError
from appliance.broker.websocket import OP_BINARY, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, WebSocketServer, frame

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


def opened() -> WebSocketServer:
    server = WebSocketServer(max_frame=1 << 20)
    data, reply = server.receive(HANDSHAKE)
    assert data == b""
    return server


def test_handshake_answers_with_the_rfc_accept_value_and_the_mqtt_subprotocol() -> None:
    server = WebSocketServer(max_frame=1024)
    assert server.receive(HANDSHAKE[:30]) == (b"", b"")  # incomplete request: wait
    data, reply = server.receive(HANDSHAKE[30:])
    assert reply.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in reply
    assert b"Sec-WebSocket-Protocol: mqtt\r\n" in reply


def test_binary_frames_of_any_size_and_split_anywhere_become_one_byte_stream() -> None:
    server = opened()
    wire = client_frame(b"a" * 10) + client_frame(b"b" * 300, final=False) + client_frame(b"c" * 70000, 0)
    out = b""
    for start in range(0, len(wire), 997):
        data, reply = server.receive(wire[start : start + 997])
        assert reply == b""
        out += data
    assert out == b"a" * 10 + b"b" * 300 + b"c" * 70000


def test_ping_gets_pong_and_close_is_echoed() -> None:
    server = opened()
    data, reply = server.receive(client_frame(b"hi", OP_PING) + client_frame(b"\x03\xe8", OP_CLOSE))
    assert data == b""
    assert reply == frame(b"hi", OP_PONG) + frame(b"\x03\xe8", OP_CLOSE)
    assert server.closed


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (client_frame(b"text", OP_TEXT), PROTOCOL_ERROR),
        (bytes((0x82, 4)) + b"abcd", PROTOCOL_ERROR),  # unmasked
        (client_frame(b"x" * 2000), PACKET_TOO_LARGE),
    ],
    ids=["text", "unmasked", "too-large"],
)
def test_bad_frames_are_protocol_errors(wire: bytes, reason: int) -> None:
    server = WebSocketServer(max_frame=1024)
    server.receive(HANDSHAKE)
    with pytest.raises(ProtocolError) as info:
        server.receive(wire)
    assert info.value.reason_code == reason


def test_a_request_that_is_not_an_upgrade_is_refused() -> None:
    with pytest.raises(ProtocolError):
        WebSocketServer(max_frame=1024).receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


def test_server_frames_use_the_right_length_encoding() -> None:
    assert frame(b"x" * 5)[:2] == b"\x82\x05"
    assert frame(b"x" * 200)[:4] == b"\x82\x7e\x00\xc8"
    assert frame(b"x" * 70000)[:2] == b"\x82\x7f"
