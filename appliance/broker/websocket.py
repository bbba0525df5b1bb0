"""MQTT over WebSocket (RFC 6455, subprotocol ``mqtt``), sans-I/O: the server side of the opening
handshake and the frame layer, so browser dashboards and paho's ``transport="websockets"`` can connect.

``WebSocketServer.receive`` takes raw socket bytes and returns the MQTT bytes they carried plus the bytes
to send back (the 101 response, PONGs, a CLOSE echo); ``frame`` wraps outgoing MQTT bytes in one binary
frame. MQTT packets may span frames and frames may hold several packets (MQTT 5 section 6), so the
payloads simply go to the MQTT reader as a byte stream. Client frames must be masked (RFC 6455 5.1).
"""

from __future__ import annotations

import base64
import hashlib
import struct

from appliance.broker.codec.reasons import MALFORMED_PACKET, PACKET_TOO_LARGE, PROTOCOL_ERROR, ProtocolError

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_HANDSHAKE_BYTES = 8192
OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def frame(payload: bytes, opcode: int = OP_BINARY) -> bytes:
    """One unmasked, final server frame."""
    length = len(payload)
    first = 0x80 | opcode
    if length < 126:
        return bytes((first, length)) + payload
    if length < 65536:
        return struct.pack(">BBH", first, 126, length) + payload
    return struct.pack(">BBQ", first, 127, length) + payload


def _unmask(data: bytes, mask: bytes) -> bytes:
    if not data:
        return data
    repeated = (mask * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(data), "big")


class WebSocketServer:
    """One connection's WebSocket state: the handshake, then frames."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.open = False
        self.closed = False
        self._buffer = bytearray()

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """(MQTT bytes carried by ``data``, bytes to send back). Raises ``ProtocolError`` for bad input."""
        self._buffer += data
        reply = b""
        if not self.open:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HANDSHAKE_BYTES:
                    raise ProtocolError(MALFORMED_PACKET, "WebSocket handshake too long")
                return b"", b""
            reply = self._handshake(bytes(self._buffer[:end]).decode("latin-1"))
            del self._buffer[: end + 4]
            self.open = True
        payload = bytearray()
        while not self.closed:
            parsed = self._next_frame()
            if parsed is None:
                break
            opcode, body = parsed
            if opcode in (OP_BINARY, OP_CONTINUATION):
                payload += body
            elif opcode == OP_PING:
                reply += frame(body, OP_PONG)
            elif opcode == OP_CLOSE:
                reply += frame(body[:2], OP_CLOSE)
                self.closed = True
            elif opcode == OP_TEXT:
                raise ProtocolError(PROTOCOL_ERROR, "MQTT over WebSocket must use binary frames")
        return bytes(payload), reply

    def _next_frame(self) -> tuple[int, bytes] | None:
        buf = self._buffer
        if len(buf) < 2:
            return None
        opcode = buf[0] & 0x0F
        if not buf[1] & 0x80:
            raise ProtocolError(PROTOCOL_ERROR, "unmasked WebSocket frame from a client")
        length = buf[1] & 0x7F
        offset = 2
        if length == 126:
            if len(buf) < 4:
                return None
            length = struct.unpack_from(">H", buf, 2)[0]
            offset = 4
        elif length == 127:
            if len(buf) < 10:
                return None
            length = struct.unpack_from(">Q", buf, 2)[0]
            offset = 10
        if length > self.max_frame:
            raise ProtocolError(PACKET_TOO_LARGE, "WebSocket frame too large")
        if len(buf) < offset + 4 + length:
            return None
        mask = bytes(buf[offset : offset + 4])
        body = _unmask(bytes(buf[offset + 4 : offset + 4 + length]), mask)
        del buf[: offset + 4 + length]
        return opcode, body

    @staticmethod
    def _handshake(request: str) -> bytes:
        lines = request.split("\r\n")
        if not lines[0].startswith("GET "):
            raise ProtocolError(MALFORMED_PACKET, "not a WebSocket upgrade request")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        key = headers.get("sec-websocket-key")
        if headers.get("upgrade", "").lower() != "websocket" or not key:
            raise ProtocolError(MALFORMED_PACKET, "not a WebSocket upgrade request")
        protocols = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        accept = base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode("ascii")
        response = [
            "HTTP/1.1 101 Switching Protocols",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Accept: {accept}",
        ]
        for wanted in ("mqtt", "mqttv3.1"):
            if wanted in protocols:
                response.append(f"Sec-WebSocket-Protocol: {wanted}")
                break
        return ("\r\n".join(response) + "\r\n\r\n").encode("ascii")
