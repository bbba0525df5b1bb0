"""MQTT over WebSocket (RFC 6455, subprotocol ``mqtt``), so browser dashboards and paho's
``transport="websockets"`` can connect: a thin adapter over wsproto, which does the opening handshake
(version 13 only, the accept key, subprotocol choice) and the frame rules (client masking, control frames
of at most 125 bytes that are never fragmented, continuation order, close codes), sans-I/O like the rest of
the broker.

``WebSocketServer.receive`` takes raw socket bytes and returns the MQTT bytes they carried plus the bytes
to send back (the 101 response, PONGs, the closing handshake, or an HTTP refusal). Binary payloads are
handed on as they arrive, frame boundaries ignored: MQTT packets may span frames and frames may hold
several packets (MQTT 5 section 6), and the MQTT reader's own packet-size limit bounds what a huge frame
can cost. After a refusal or a close, ``closed`` is set and ``failure`` says why (None for a clean close
by the client); the caller sends the reply and closes the connection.
"""

from __future__ import annotations

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError

# What the server offers, in order of preference: "mqtt" (MQTT 3.1.1 and 5) and the MQTT 3.1 name.
SUBPROTOCOLS = ("mqtt", "mqttv3.1")


class WebSocketServer:
    """One connection's WebSocket state: the handshake, then frames."""

    def __init__(self) -> None:
        self._connection = WSConnection(ConnectionType.SERVER)
        self.closed = False
        self.failure: str | None = None

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """(MQTT bytes carried by ``data``, bytes to send back)."""
        if self.closed:
            return b"", b""
        connection = self._connection
        payload = bytearray()
        reply = bytearray()
        try:
            connection.receive_data(data)
            for event in connection.events():
                if isinstance(event, Request):
                    offered = [name for name in SUBPROTOCOLS if name in event.subprotocols]
                    reply += connection.send(AcceptConnection(subprotocol=offered[0] if offered else None))
                elif isinstance(event, BytesMessage):
                    payload += event.data
                elif isinstance(event, Ping):
                    reply += connection.send(event.response())
                elif isinstance(event, TextMessage):
                    # MQTT 5 section 6.0: a packet not in a binary frame closes the connection.
                    reply += self._close(CloseReason.UNSUPPORTED_DATA, "MQTT over WebSocket must use binary frames")
                    break
                elif isinstance(event, CloseConnection):
                    if event.code == CloseReason.PROTOCOL_ERROR:
                        reply += self._close(event.code, event.reason or "bad WebSocket frame")
                    else:  # the client's own close: answer it, the closing handshake is done
                        if connection.state is ConnectionState.REMOTE_CLOSING:
                            reply += connection.send(event.response())
                        self.closed = True
                    break
        except RemoteProtocolError as exc:  # a bad opening handshake: answer with its HTTP status
            hint = exc.event_hint if isinstance(exc.event_hint, RejectConnection) else RejectConnection(status_code=400)
            reply += connection.send(hint)
            self.closed = True
            self.failure = f"bad WebSocket handshake: {exc}"
        return bytes(payload), bytes(reply)

    def send(self, mqtt_bytes: bytes) -> bytes:
        """``mqtt_bytes`` as one binary frame (unmasked, as a server's are)."""
        return self._connection.send(BytesMessage(data=mqtt_bytes))

    def _close(self, code: int, reason: str) -> bytes:
        self.closed = True
        self.failure = reason
        return self._connection.send(CloseConnection(code=code, reason=reason[:120]))
