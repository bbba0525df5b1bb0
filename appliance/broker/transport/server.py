"""The only socket code: one protocol object per client connection, and the TCP/TLS listeners.

Kept thin on purpose (uvicorn's ``h11_impl`` is the model): bytes go to the broker as they arrive, the
broker writes back through ``write``.

Rules
-----
What lives here is what needs the transport:

* fairness of reading: the protocol is an ``asyncio.BufferedProtocol`` with a ``READ_BUFFER_BYTES``
  buffer, so one read is small (an ``asyncio.Protocol`` gets up to 256 KiB from uvloop, about 3,300
  PUBLISHes that were all parsed in one go), and a read that fills the buffer and yields packets uses up
  the connection's turn: it reads again in the next loop iteration, after every other client. A flooding
  publisher thus costs the others at most one small read's worth of work per turn. (uvloop takes the
  buffered path only for a class that is *not* an ``asyncio.Protocol``, hence the base class.) A read that
  completes no packet (the middle of a large PUBLISH) does not end the turn, so big packets still arrive
  at socket speed;
* flow control: ``pause_writing`` marks the connection congested and stops reading from that client
  until ``resume_writing``, so a client that does not read cannot make us buffer without bound. The
  broker then holds back the publishers whose messages go to it (TCP backpressure, lossless), but only
  for ``backpressure.SLOW_CONSUMER_GRACE`` seconds (that timer, and the keep-alive timer, live in the
  broker core behind its clock port, so they are tested with a fake clock);
* reading is also held while the broker awaits something for the connection (password check, a
  service's ``on_publish``) so its packets stay in order; each reason to hold is kept separately;
* a connection that sends no CONNECT within ``CONNECT_TIMEOUT`` is dropped;
* a lingering close: when the server ends a connection, its last bytes (a DISCONNECT) go out, then the
  write side is shut down (FIN) and input is read and discarded for up to ``LINGER_SECONDS`` before the
  socket closes. Closing at once would make the kernel answer a client that is still sending with a
  reset, which throws away the DISCONNECT it had not read yet (paho.mqtt.testing sees a broken pipe);
* WebSocket listeners unwrap frames here (``websocket.WebSocketServer``), so the broker only ever sees
  the MQTT byte stream.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

from appliance.broker.config import ListenerConfig
from appliance.broker.sessions.session import AWAITING_CONNECT, ClientConnection
from appliance.broker.transport.certificates import CertificateFileError, date_problems
from appliance.broker.transport.link import BrokerCore
from appliance.startup_error import StartupError
from appliance.tcp_floor import keep_kernel_floor

if TYPE_CHECKING:
    from appliance.broker.transport.websocket import WebSocketServer

log = logging.getLogger("appliance.broker.transport.server")

CONNECT_TIMEOUT = 10.0
#: Bytes per read: small enough that parsing one read is a short piece of work (about 50 small
#: PUBLISHes), large enough that a read is not per packet. 4 KiB measured best for latency under a flood
#: with the same flood throughput as 16 KiB (bench/RESULTS.md).
READ_BUFFER_BYTES = 4096
#: Seconds a connection the server ends is still drained (input discarded) after its FIN went out.
LINGER_SECONDS = 2.0


class ClientProtocol(asyncio.BufferedProtocol):
    # Slots: one of these lives per connection (idle connections' memory, bench/idle_connections.py).
    __slots__ = ("broker", "_websocket", "connection", "transport", "_loop", "_deadlines", "_lingering", "_holds",
                 "_reading", "_buffer")

    def __init__(
        self, broker: BrokerCore, websocket: type[WebSocketServer] | None = None, read_buffer: memoryview | None = None,
        connect_deadlines: ConnectDeadlines | None = None,
    ) -> None:
        """``websocket`` is the WebSocket adapter's class for a WebSocket listener (passed in, so a gateway
        without one never imports wsproto). ``read_buffer`` and ``connect_deadlines`` are shared by every
        connection of one listener: each read is copied out in ``buffer_updated`` before the loop starts the
        next, so 2,000 connections cost one buffer instead of 8 MB of them, and one timer instead of 2,000."""
        self.broker = broker
        limits = broker.limits
        self._websocket = websocket() if websocket is not None else None
        self.connection = ClientConnection(limits.max_packet_size, limits.topic_alias_maximum, "?")
        self.connection.link = self
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._deadlines = connect_deadlines if connect_deadlines is not None else ConnectDeadlines(self._loop)
        self._lingering: asyncio.TimerHandle | None = None
        #: Why reading is held; None until the first hold (an empty set is 216 bytes, per connection).
        self._holds: set[str] | None = None
        self._reading = True
        self._buffer = read_buffer if read_buffer is not None else memoryview(bytearray(READ_BUFFER_BYTES))

    # -- asyncio.BufferedProtocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, but they have its methods.
        self.transport = writer = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.connection.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        high = self.broker.limits.outbound_buffer_bytes
        writer.set_write_buffer_limits(high=high, low=high // 4)
        self._deadlines.add(self)
        self.broker.connection_made(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._lingering is not None:
            return  # closing: input is drained and discarded
        # A plain connection hands the read to the broker from here: one Python frame less per wake-up.
        data = bytes(self._buffer[:nbytes])
        parsed = self.broker.data_received(self, data) if self._websocket is None else self._unwrapped(data)
        if nbytes == len(self._buffer) and parsed and self._reading:
            # More is probably waiting; read it in the next loop iteration, after everyone else.
            self.hold_reading("turn", True)
            self._loop.call_soon(self.hold_reading, "turn", False)

    def _unwrapped(self, data: bytes) -> int:
        """Unwrap WebSocket frames and hand their payload to the broker; returns how many packets it
        completed."""
        websocket = self._websocket
        assert websocket is not None
        data, reply = websocket.receive(data)
        if reply and self.transport is not None:
            self.transport.write(reply)
        completed = self.broker.data_received(self, data) if data else 0
        if websocket.closed:
            if websocket.failure is not None:
                log.info("client %s: %s; closing", self.connection.client_id or self.connection.peer, websocket.failure)
            self.close()
        return completed

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadlines.discard(self)
        if self._lingering is not None:
            self._lingering.cancel()
        self.broker.connection_lost(self)

    def pause_writing(self) -> None:
        self.connection.congested = True
        self.hold_reading("writing", True)
        self.broker.congestion_changed(self, True)

    def resume_writing(self) -> None:
        self.connection.congested = False
        self.connection.overloaded = False
        self.hold_reading("writing", False)
        self.broker.congestion_changed(self, False)

    # -- what the broker calls ------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing() and self._lingering is None:
            websocket = self._websocket
            if websocket is None:
                transport.write(data)
            elif not websocket.closed:  # nothing may follow a close frame
                transport.write(websocket.send(data))

    def close(self) -> None:
        """End the connection after what was written: a lingering close where the transport can half-close
        (TCP), a plain one otherwise (TLS ends with its own close_notify)."""
        transport = self.transport
        if transport is None or transport.is_closing() or self._lingering is not None:
            return
        if not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:  # the peer reset the connection and the loop has not seen it yet: nothing to linger for
            transport.abort()
            return
        self._lingering = self._loop.call_later(LINGER_SECONDS, transport.close)
        self._holds = None
        self._update_reading()

    def peer_closed(self) -> bool:
        """A peek at the socket: held reading means the transport has not seen a FIN or reset yet. An
        empty peek is a FIN with nothing unread before it, an error a reset; data or nothing yet means the
        client may still be there."""
        return self._peek() in ("eof", "gone")

    def unread_input(self) -> bool:
        return self._peek() == "data"

    def _peek(self) -> str:
        """What waits in the socket, without taking it: "data", "eof" (a FIN with nothing unread before
        it), "gone" (closed or reset) or "nothing". (A duplicate descriptor, since uvloop's socket object
        cannot recv.)"""
        transport = self.transport
        if transport is None or transport.is_closing():
            return "gone"
        sock = transport.get_extra_info("socket")
        if sock is None:
            return "nothing"
        try:
            with socket.fromfd(sock.fileno(), sock.family, sock.type) as probe:
                return "data" if probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) else "eof"
        except BlockingIOError:
            return "nothing"
        except OSError:
            return "gone"

    def hold_reading(self, reason: str, held: bool) -> None:
        """Stop (or resume) reading for one ``reason``; reading resumes when no reason is left."""
        holds = self._holds
        if held:
            if holds is None:
                holds = self._holds = set()
            holds.add(reason)
        elif holds is not None:
            holds.discard(reason)
        self._update_reading()

    # -- internals ------------------------------------------------------------------------------------

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        want = not self._holds or self._lingering is not None  # a lingering close drains whatever comes
        if want != self._reading:
            self._reading = want
            if want:
                transport.resume_reading()
            else:
                transport.pause_reading()

    def connect_deadline_passed(self) -> None:
        """``CONNECT_TIMEOUT`` after the connection came (``ConnectDeadlines``)."""
        if self.connection.state == AWAITING_CONNECT:
            log.info("client %s: no CONNECT within %.0fs; closing", self.connection.peer, CONNECT_TIMEOUT)
            self.close()


class ConnectDeadlines:
    """The connections of one listener still inside their ``CONNECT_TIMEOUT``, checked by one timer.

    Every connection gets the same timeout from the moment it came, so arrival order is deadline order:
    a FIFO (an ``OrderedDict``: a closed connection leaves it at once, and the oldest entry is found
    without scanning) and one timer armed for its oldest entry do what a timer per connection did, for
    about a hundred bytes per waiting connection instead of a timer handle's six hundred. An entry stays
    until its deadline even when CONNECT came (the check then finds nothing to do), so reading packets
    costs nothing here.
    """

    __slots__ = ("_loop", "_waiting", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: OrderedDict[ClientProtocol, float] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, protocol: ClientProtocol) -> None:
        deadline = self._loop.time() + CONNECT_TIMEOUT
        self._waiting[protocol] = deadline
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._expire)

    def discard(self, protocol: ClientProtocol) -> None:
        self._waiting.pop(protocol, None)

    def _expire(self) -> None:
        self._timer = None
        waiting = self._waiting
        now = self._loop.time()
        while waiting:
            protocol, deadline = next(iter(waiting.items()))
            if deadline > now:
                self._timer = self._loop.call_at(deadline, self._expire)
                return
            del waiting[protocol]
            protocol.connect_deadline_passed()



class TlsSetupError(StartupError):
    """A TLS listener's certificate, key or CA file (``role``) cannot be used."""

    def __init__(self, role: str, path: str, why: str) -> None:
        self.role = role
        super().__init__(path, why)

    @property
    def location(self) -> str:
        return f"TLS {self.role} {self.path}"


def _readable_file(path: object, role: str) -> str:
    text = str(path)
    try:
        with open(text, "rb") as file:
            file.read(1)
    except OSError as exc:
        raise TlsSetupError(role, text, exc.strerror or str(exc)) from None
    return text


def tls_context(listener: ListenerConfig) -> ssl.SSLContext:
    """The listener's server context. OpenSSL's own errors name no file ("[SSL] PEM lib"), so each file is
    opened first and each load is reported with the file it was given."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    assert listener.certfile is not None
    certfile = _readable_file(listener.certfile, "certfile")
    keyfile = _readable_file(listener.keyfile, "keyfile") if listener.keyfile else None
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        key = f" with keyfile {keyfile}" if keyfile else ""
        raise TlsSetupError(
            "certfile", certfile, f"cannot be loaded{key} ({exc.reason or exc}): not PEM, or the key does not match the certificate"
        ) from None
    if listener.cafile is not None:
        cafile = _readable_file(listener.cafile, "cafile")
        try:
            context.load_verify_locations(cafile=cafile)
        except ssl.SSLError as exc:
            raise TlsSetupError("cafile", cafile, f"cannot be loaded ({exc.reason or exc}): not PEM certificates") from None
    context.verify_mode = ssl.CERT_REQUIRED if listener.require_certificate else ssl.CERT_NONE
    warn_about_dates(listener)
    return context


def warn_about_dates(listener: ListenerConfig) -> None:
    """One warning per certificate that is expired, not yet valid or near its expiry (``certificates``:
    a warning, not a refusal to start)."""
    now = datetime.now(UTC)
    for path, role in ((listener.certfile, "certfile"), (listener.cafile, "cafile")):
        if path is None:
            continue
        try:
            for problem in date_problems(path, role, now):
                log.warning("%s", problem)
        except CertificateFileError as exc:  # OpenSSL loaded it, so this is only about reading its dates
            log.warning("%s; its validity dates are not checked", exc)


def _websocket_adapter() -> type[WebSocketServer]:
    """Imported on demand: only a gateway that serves WebSocket loads wsproto."""
    from appliance.broker.transport.websocket import WebSocketServer

    return WebSocketServer


async def start_listener(broker: BrokerCore, listener: ListenerConfig) -> tuple[asyncio.Server, str]:
    """Start one listener; returns the server and its URL with the port actually bound.

    A websocket listener with a ``certfile`` speaks ``wss``; the HTTP path is not checked."""
    loop = asyncio.get_running_loop()
    websocket = listener.type == "websocket"
    secure = listener.type == "tls" or (websocket and listener.certfile is not None)
    context = tls_context(listener) if secure else None
    adapter = _websocket_adapter() if websocket else None
    read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))
    deadlines = ConnectDeadlines(loop)
    server = await loop.create_server(
        lambda: ClientProtocol(broker, adapter, read_buffer, deadlines), listener.host, listener.port, ssl=context, backlog=4096,
        reuse_address=True,
        # A TLS client gets as long for its handshake as a plain one gets to send CONNECT (asyncio: 60 s).
        ssl_handshake_timeout=CONNECT_TIMEOUT if context is not None else None,
    )
    for sock in server.sockets:
        # The image raises the namespace's retransmission floor for the slow uplink; clients on the LAN keep
        # the kernel's own (appliance/tcp_floor.py).
        keep_kernel_floor(sock)
    sockname = server.sockets[0].getsockname()
    scheme = ("wss" if secure else "ws") if websocket else ("tls" if secure else "tcp")
    host = sockname[0] if ":" not in sockname[0] else f"[{sockname[0]}]"
    return server, f"{scheme}://{host}:{sockname[1]}"
