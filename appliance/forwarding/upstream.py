"""The ``$upstream`` endpoint: an MQTT bridge (paho-mqtt, MQTT 5 or 3.1.1) to the cloud broker.

* QoS 1, and a message counts as sent only once its PUBACK (and those of the messages before it) is in:
  the pump takes messages off their queue after that, never before (at-least-once; the message id is
  stable across retries). Two formats (docs/message-format.md): ``message`` publishes each message with
  its ``gw-*`` user properties, at most ``estimate.window()`` unacknowledged; ``batch`` packs the pump's
  batch into PUBLISHes of ``packed_window().chunk_bytes`` (appliance/forwarding/batch.py), at most a
  window's worth of them unacknowledged - on a slow link the identity then costs a few bytes per message
  instead of more than the payload.
* Every paho call runs on the gateway's event loop, and there is no network thread. paho's write routine
  has no lock: with a thread running ``client.loop()`` while the pump called ``publish()`` from the loop,
  two threads wrote from one output queue, and adjacent PUBLISHes left swapped or with their bytes
  interleaved (issue 14). paho 2's external-loop hooks (``on_socket_open``/``close``/``register_write``/
  ``unregister_write``) put its socket on ``loop.add_reader``/``add_writer``; ``loop_read``, ``loop_write``
  and ``loop_misc`` run from those callbacks and a timer. A PUBLISH is queued by ``publish()`` and written
  by ``loop_write`` in queue order, on one thread.
* paho's ``connect()`` would resolve, connect and shake hands (TLS) blocking; the bridge does those with
  asyncio and hands paho the connected socket (``_ConnectedClient``, the one paho internal overridden).
* Reconnecting is ours: exponential backoff with jitter, and a *fresh* client per connection - paho would
  otherwise replay its own in-flight copies on reconnect while the pump resends the batch too.
* Keep-alive (``appliance/forwarding/liveness.py``): while PUBLISHes or a PINGREQ are in flight a link
  that still makes progress (PUBACKs, TCP acknowledging our bytes) within 1.5 keep-alives plus one step
  of the link is alive however slow; paho's PINGREQ rule runs only while nothing is in flight, so a
  PINGREQ stuck behind a full link, or a round trip longer than the keep-alive, is not taken for a dead
  link; the CONNACK has ``CONNECT_TIMEOUT_S``.
* The link under the bridge (the cellular modem) may be known to be down: ``set_link(False)`` closes the
  connection and no attempt is made until ``set_link(True)``, which also skips any backoff still running -
  retrying blindly over a modem that is not registered only burns the backoff ceiling, and the link coming
  back is the best moment to connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import random
import socket
import ssl
import struct
import termios
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.backoff import Backoff
from appliance.forwarding.batch import encode_batch
from appliance.forwarding.config import UpstreamConfig
from appliance.forwarding.endpoints import (
    Refused,
    SendFailed,
    Unsendable,
    identity_properties,
    message_id,
)
from appliance.forwarding.liveness import Liveness
from appliance.forwarding.metrics import LinkStats
from appliance.forwarding.queues import QueuedMessage
from appliance.forwarding.routes import UPSTREAM
from appliance.forwarding.validity import publish_size, upstream_problem
from appliance.forwarding.window import LinkEstimate, Window
from appliance.tcp_floor import retransmission_floor_s

log = logging.getLogger(__name__)


def wire_size(topic: str, payload: bytes, properties: Properties | None) -> int:
    """Roughly the PUBLISH packet's size: what the link actually carries for it."""
    size = 2 + 2 + 2 + len(topic) + 8 + len(payload)
    for key, value in getattr(properties, "UserProperty", None) or ():
        size += 5 + len(key) + len(value)
    return size


def pack(batch: list[QueuedMessage], chunk_bytes: int) -> list[list[QueuedMessage]]:
    """Consecutive runs of ``batch`` of at most ``chunk_bytes`` payload each (at least one message)."""
    chunks: list[list[QueuedMessage]] = []
    size = 0
    for item in batch:
        if not chunks or size + item.size > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += item.size
    return chunks


def connect_failure_reason(exc: BaseException) -> str:
    """What an operator reads in the log: "Connection refused", not "Connect call failed (...)"."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
    if isinstance(exc, OSError) and exc.errno and not isinstance(exc, ssl.SSLError):
        return f"{os.strerror(exc.errno)} ({exc})"
    return str(exc) or type(exc).__name__


#: Seconds for the TCP connect and for the TLS handshake, each.
CONNECT_TIMEOUT_S = 10.0
#: How often keep-alive (liveness and paho's PINGREQ) is looked at.
TICK_S = 0.25
#: The Receive Maximum of a server that announces none (MQTT 5 section 3.2.2.3.3), and of MQTT 3.1.1.
RECEIVE_MAXIMUM_DEFAULT = 65535
#: How long a DISCONNECT may take to leave before the socket is simply closed.
CLOSE_TIMEOUT_S = 1.0


class _ConnectedClient(mqtt.Client):
    """paho's client on a socket the bridge has already connected (and TLS-wrapped) without blocking.

    ``connect()`` calls ``_create_socket``; this returns the socket handed over in ``use_socket`` instead of
    opening one with blocking calls. Everything else - CONNECT, the socket hooks - is paho's own path.
    """

    def use_socket(self, sock: socket.socket) -> None:
        self._connected_socket: socket.socket | None = sock

    @property
    def awaiting_pingresp(self) -> bool:
        """A PINGREQ is out and its PINGRESP not in (paho's own ``_ping_t``)."""
        return self._ping_t > 0

    def _create_socket(self) -> Any:
        sock, self._connected_socket = self._connected_socket, None
        if sock is None:
            raise OSError("no connected socket to hand to paho")
        return sock


def send_queue_bytes(sock: Any) -> int | None:
    """Bytes in the socket's send queue, not yet acknowledged by TCP (Linux ``TIOCOUTQ``); None if unknown."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return None


#: ``struct tcp_info`` up to ``tcpi_bytes_acked`` (Linux 4.1+): the 64-bit counter sits at byte 120.
_TCP_INFO_BYTES_ACKED = struct.Struct("=120xQ")


def acked_bytes(sock: Any) -> int | None:
    """How many bytes of ours TCP has acknowledged so far (``tcpi_bytes_acked``); None where unknown.

    A counter, not the send queue's size: the queue may stay as long, or grow, while the link carries
    bytes, when new PUBLISHes are written between two looks at it (then "the queue shrank" saw no progress)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES_ACKED.size)
    except (OSError, ValueError, AttributeError):
        return None
    return _TCP_INFO_BYTES_ACKED.unpack(info)[0] if len(info) >= _TCP_INFO_BYTES_ACKED.size else None



def _abandon_acks(futures: list[asyncio.Future[float]]) -> None:
    """Futures of PUBACKs no one will wait for: cancel those still open, and take the exception of those
    that failed, so that a lost connection does not log "Future exception was never retrieved" once per
    PUBLISH that was in flight when the batch was given up."""
    for future in futures:
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()

class UpstreamSender:
    def __init__(self, settings: UpstreamConfig, gateway_id: str, stats: LinkStats) -> None:
        assert settings.host is not None
        self.id = UPSTREAM
        self.settings = settings
        self.gateway_id = gateway_id
        self.stats = stats
        self.estimate = LinkEstimate()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = asyncio.Event()
        self._stopping = False
        self._link_up = True
        # Set on every change of the link state or on stop: a connection or a backoff wait ends early.
        self._link_changed = asyncio.Event()
        self.on_connection_change: Callable[[bool], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._client: _ConnectedClient | None = None
        self._socket: Any = None  # the client's socket while it is open
        self._closed = asyncio.Event()  # the current client's socket closed
        self._liveness: Liveness | None = None
        self._connect_started = 0.0
        self._pending: dict[int, asyncio.Future[float]] = {}
        # Jittered, so a fleet that lost the same cloud at the same moment does not come back in step.
        self._backoff = Backoff(settings.backoff_min_s, settings.backoff_max_s, random.Random())
        self._ready_flag = False
        self._max_packet: int | None = None  # the upstream's Maximum Packet Size (MQTT 5 CONNACK)
        self._receive_max = RECEIVE_MAXIMUM_DEFAULT  # the upstream's Receive Maximum (MQTT 5 CONNACK)
        # Why the last connection ended, and whether that blames the messages in flight (not when the
        # bridge closed it itself: a stop, the modem reporting the link down).
        self._lost_reason = ""
        self._lost_blames = False
        self._answered = False  # the current connection got its CONNACK (accepting or refusing)
        self._tls: ssl.SSLContext | None = None
        self.connects = 0

    # -- lifecycle

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.settings.tls:
            self._tls = self._tls_context()
        self._task = asyncio.create_task(self._run(), name="forwarding-upstream")

    async def stop(self) -> None:
        """A polite DISCONNECT when connected; a connect attempt in progress is abandoned."""
        self._stopping = True
        self._link_changed.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=CLOSE_TIMEOUT_S + 2 * TICK_S)
            self._task.cancel()  # still connecting (up to CONNECT_TIMEOUT_S): the socket is closed on the way out
            await asyncio.gather(self._task, return_exceptions=True)

    def set_link(self, up: bool) -> None:
        """The link under the bridge went up or down (called on the event loop)."""
        if up == self._link_up:
            return
        self._link_up = up
        self._link_changed.set()
        log.info("upstream: link %s: %s", "up" if up else "down", "connecting" if up else "no connection attempts until it is back")

    # -- connection loop

    async def _run(self) -> None:
        while not self._stopping:
            while not self._link_up and not self._stopping:
                self._link_changed.clear()
                await self._link_changed.wait()
            if self._stopping:
                break
            self._link_changed.clear()
            try:
                sock = await self._open_socket()
            except (TimeoutError, OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                log.warning("upstream %s:%s: connect failed: %s", self.settings.host, self.settings.port,
                            connect_failure_reason(exc))
            else:
                if await self._session(sock):
                    self._backoff.reset()
            self._set_ready(False)
            if self._link_changed.is_set():
                self._backoff.reset()  # the link went or came back meanwhile: a new link, try at once (or wait for it)
            elif not self._stopping:
                delay = self._backoff.next_delay()
                # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a stop()'s cancellation.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._link_changed.wait()

    async def _open_socket(self) -> Any:
        """A connected TCP socket (TLS-wrapped with the handshake done), opened without blocking the loop."""
        loop = asyncio.get_running_loop()
        s = self.settings
        assert s.host is not None
        failure: Exception = OSError(f"no address for {s.host}")
        for family, kind, proto, _, address in await loop.getaddrinfo(s.host, s.port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, address), CONNECT_TIMEOUT_S)
                if self._tls is None:
                    return sock
                return await asyncio.wait_for(self._handshake(sock), CONNECT_TIMEOUT_S)
            except (TimeoutError, OSError) as exc:
                sock.close()
                failure = exc
            except BaseException:  # cancelled (the bridge stops): no socket left behind
                sock.close()
                raise
        raise failure

    async def _handshake(self, sock: socket.socket) -> ssl.SSLSocket:
        assert self._tls is not None
        wrapped = self._tls.wrap_socket(sock, server_hostname=self.settings.host, do_handshake_on_connect=False)
        while True:
            try:
                wrapped.do_handshake()
                return wrapped
            except ssl.SSLWantReadError:
                await self._fd_ready(wrapped, write=False)
            except ssl.SSLWantWriteError:
                await self._fd_ready(wrapped, write=True)

    async def _fd_ready(self, sock: Any, write: bool) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        (loop.add_writer if write else loop.add_reader)(sock, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            (loop.remove_writer if write else loop.remove_reader)(sock)

    def _tls_context(self) -> ssl.SSLContext:
        s = self.settings
        context = ssl.create_default_context(cafile=str(s.ca_file) if s.ca_file else None)
        if s.cert_file:
            context.load_cert_chain(str(s.cert_file), str(s.key_file) if s.key_file else None)
        if s.tls_insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def _new_client(self) -> _ConnectedClient:
        s = self.settings
        v5 = s.protocol == "5"
        client = _ConnectedClient(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=s.client_id or self.gateway_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            clean_session=None if v5 else True,
        )
        client.max_inflight_messages_set(65535)
        client.max_queued_messages_set(0)
        if s.username is not None:
            client.username_pw_set(s.username, s.password)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_socket_register_write
        client.on_socket_unregister_write = self._on_socket_unregister_write
        return client

    async def _session(self, sock: Any) -> bool:
        """Run one MQTT connection on ``sock`` until it closes, the link goes down or the bridge stops.
        True if the upstream accepted it (CONNACK), so the backoff starts over."""
        client = self._new_client()
        client.use_socket(sock)
        self._client = client
        self._answered = False
        self._closed.clear()
        assert self._loop is not None
        self._liveness = Liveness(self.settings.keepalive_s, self._loop.time())
        self._connect_started = self._loop.time()
        accepted = False
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            client.connect(self.settings.host or "", self.settings.port, keepalive=self.settings.keepalive_s)
            while not closed.done():
                if self._stopping or not self._link_up:
                    client.disconnect()  # a polite DISCONNECT if it leaves soon; the socket is closed anyway
                    await asyncio.wait({closed}, timeout=CLOSE_TIMEOUT_S)
                    break
                await asyncio.wait({closed}, timeout=TICK_S)
                accepted = accepted or self._ready_flag
                if not closed.done():
                    self._tick(client)
        finally:
            closed.cancel()
            self._abandon(client)
        return accepted

    def _tick(self, client: _ConnectedClient) -> None:
        """Keep-alive: busy, the link must make progress; idle, paho's PINGREQ/PINGRESP rule; before the
        CONNACK, ``CONNECT_TIMEOUT_S``."""
        assert self._loop is not None and self._liveness is not None
        now = self._loop.time()
        sock = self._socket
        queued = send_queue_bytes(sock) if sock is not None else None
        # A PINGREQ out counts as data in flight: its PINGRESP may take a round trip longer than the
        # keep-alive (paho's rule), on a satellite link or behind a frame on a slow one.
        busy = bool(self._pending) or client.want_write() or bool(queued) or client.awaiting_pingresp
        acked = acked_bytes(sock) if sock is not None else None
        if not self._liveness.alive(now, busy, acked, self.estimate.progress_step_s()):
            self._abandon(client, f"no progress for {now - self._liveness.progress_at:.1f} s with data in flight "
                                  f"(allowed {self._liveness.allowed_s(self.estimate.progress_step_s()):.1f} s): "
                                  "the link is dead")
            return
        if not self._ready_flag:
            # paho's keep-alive would give the CONNACK one keep-alive period, and a CONNECT queued behind the
            # last connection's bytes on a slow link takes longer (a 1 s keep-alive at 9.6 kbit/s failed so).
            if now - self._connect_started > CONNECT_TIMEOUT_S:
                self._abandon(client, f"no CONNACK within {CONNECT_TIMEOUT_S:.0f} s")
            return
        if not busy and client.loop_misc() != mqtt.MQTT_ERR_SUCCESS:
            self._abandon(client, "keep-alive: no PINGRESP")

    def _abandon(self, client: _ConnectedClient, reason: str | None = None) -> None:
        """Drop the connection without asking paho: unhook and close its socket; a fresh client comes next.
        Logs ``upstream disconnected`` as paho's callback does, when paho has not said so already. Without
        a ``reason`` the bridge closes it by its own choice (a stop, the link down): nothing is blamed."""
        blames = reason is not None and not self._closing_by_choice()
        if self._client is client and self._ready_flag:
            self._lost(reason or "closed by the bridge", blames)
        elif self._client is client and blames and not self._answered:  # failed before its CONNACK
            log.warning("upstream %s:%s: connection failed before the CONNACK: %s", self.settings.host,
                        self.settings.port, reason)
        sock = self._socket
        if sock is not None and self._client is client:
            assert self._loop is not None
            self._loop.remove_reader(sock)
            self._loop.remove_writer(sock)
            sock.close()
            self._socket = None
        if self._client is client:
            self._client = None
        self._closed.set()
        self._set_ready(False)

    def _closing_by_choice(self) -> bool:
        return self._stopping or not self._link_up

    def _lost(self, reason: str, blames: bool) -> None:
        """The connection ended: logged at WARNING unless the bridge ended it (a stop, the link down)."""
        self._lost_reason, self._lost_blames = reason, blames
        log.log(logging.WARNING if blames else logging.INFO, "upstream disconnected: %s", reason)

    # -- paho's socket hooks and callbacks (all on the event loop)

    def _on_socket_open(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        assert self._loop is not None
        self._socket = sock
        self._loop.add_reader(sock, self._readable, client)

    def _on_socket_close(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        assert self._loop is not None
        if sock.fileno() >= 0:  # an abandoned client's socket is closed already (its __del__ closes it again)
            self._loop.remove_reader(sock)
            self._loop.remove_writer(sock)
        if self._socket is sock:
            self._socket = None
        if client is self._client:
            self._closed.set()

    def _on_socket_register_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        assert self._loop is not None
        self._loop.add_writer(sock, self._writable, client)

    def _on_socket_unregister_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        assert self._loop is not None
        self._loop.remove_writer(sock)

    def _readable(self, client: mqtt.Client) -> None:
        assert self._loop is not None and self._liveness is not None
        self._liveness.received(self._loop.time())
        rc = client.loop_read()
        # TLS: a record may hold more than paho read; those bytes wait in the SSL object with the fd quiet.
        while rc == mqtt.MQTT_ERR_SUCCESS and isinstance(self._socket, ssl.SSLSocket) and self._socket.pending():
            rc = client.loop_read()
        if rc != mqtt.MQTT_ERR_SUCCESS and client is self._client:
            self._abandon(client, f"read: {mqtt.error_string(rc)}")

    def _writable(self, client: mqtt.Client) -> None:
        rc = client.loop_write()
        if rc != mqtt.MQTT_ERR_SUCCESS and client is self._client:
            self._abandon(client, f"write: {mqtt.error_string(rc)}")

    def _set_ready(self, ready: bool) -> None:
        if ready == self._ready_flag:
            return
        self._ready_flag = ready
        self.stats.connected = ready
        if self.on_connection_change is not None:
            self.on_connection_change(ready)
        if ready:
            self.estimate.reconnected()
            self._ready.set()
            return
        self._ready.clear()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(SendFailed(f"upstream connection lost: {self._lost_reason}",
                                                link_dropped=self._lost_blames))
        self._pending.clear()

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self._answered = True
        if reason.is_failure:
            log.warning("upstream %s:%s refused the connection: %s (0x%02X)%s", self.settings.host, self.settings.port,
                        reason, reason.value, "" if self.settings.username is None else f" for user {self.settings.username!r}")
            client.disconnect()
            return
        self.connects += 1
        assert self._loop is not None
        self._set_ready(True)  # a new connection for the estimate: the round trip below belongs to it
        self.estimate.note_round_trip(self._loop.time() - self._connect_started)
        self._max_packet = getattr(properties, "MaximumPacketSize", None)
        self._receive_max = getattr(properties, "ReceiveMaximum", None) or RECEIVE_MAXIMUM_DEFAULT
        floor = retransmission_floor_s(self._socket) if self._socket is not None else None
        # The floor TCP retransmits above: the image sizes it for the slowest uplink (appliance/tcp_floor.py).
        log.info("upstream connected to %s:%s (retransmission floor %s)", self.settings.host, self.settings.port,
                 "unknown" if floor is None else f"{floor:.2f} s")

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if client is not self._client:
            return
        if self._ready_flag:
            server_says = getattr(properties, "ReasonString", None)
            self._lost(f"{reason}" + (f" ({server_says})" if server_says else ""), not self._closing_by_choice())
        self._set_ready(False)

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        assert self._loop is not None
        future = self._pending.pop(mid, None)
        if future is None or future.done() or client is not self._client:
            return
        if getattr(reason, "is_failure", False):
            future.set_exception(Refused(f"{reason} (0x{reason.value:02X})"))
        else:
            future.set_result(self._loop.time())

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def topic_for(self, item: QueuedMessage) -> str:
        m = item.message
        return self.settings.topic_template.format(
            gateway_id=self.gateway_id, device_id=m.device_id, module_id=m.module_id or "", output=m.output or "",
            message_id=message_id(item, self.gateway_id), priority=item.priority,
        )

    def publish_direct(self, topic: str, payload: bytes) -> None:
        """Fire-and-forget QoS 1 (gateway metrics): skipped while disconnected, never queued."""
        client = self._client
        if client is not None and self._ready.is_set():
            client.publish(topic, payload, qos=1)

    def window(self) -> Window:
        if self.settings.format == "message":
            return self.estimate.window()
        limit = self.settings.batch_max_bytes
        if self._max_packet is not None:  # room for the fixed header, topic and batch header
            limit = max(1, min(limit, self._max_packet - 512))
        return self.estimate.packed_window(limit)

    def _groups(self, batch: list[QueuedMessage]) -> list[list[QueuedMessage]]:
        """The messages of each PUBLISH that ``batch`` goes out as."""
        if self.settings.format == "batch":
            chunk = self.window().chunk_bytes
            assert chunk is not None
            return pack(batch, chunk)
        return [[item] for item in batch]

    def _unit(self, items: list[QueuedMessage], sent_ms: int) -> tuple[str, bytes, Properties | None]:
        """(topic, payload, properties) of the PUBLISH of ``items``, stamped ``sent_ms`` (this attempt)."""
        if self.settings.format == "batch":
            priority = items[0].priority
            return (self.settings.batch_topic.format(gateway_id=self.gateway_id, priority=priority),
                    encode_batch(self.gateway_id, priority, sent_ms, items), None)
        item = items[0]
        properties = None
        if self.settings.protocol == "5":
            properties = Properties(PacketTypes.PUBLISH)
            properties.UserProperty = identity_properties(item, self.gateway_id, sent_ms)
            if item.message.content_type:
                properties.ContentType = item.message.content_type
        return self.topic_for(item), item.message.payload, properties

    def _in_flight_limit(self) -> int:
        """PUBLISHes that may be unacknowledged, re-read after every ack so it follows the link; never more
        than the server's Receive Maximum (MQTT 5 section 3.3.4: a server closes the connection, 0x93, and
        the pump would blame the message at the head for the drop)."""
        window = self.window()
        if window.chunk_bytes is None:
            return min(window.messages, self._receive_max)
        assert window.bytes is not None
        return min(max(2, -(-window.bytes // window.chunk_bytes)), self._receive_max)

    def _check_unit(self, topic: str, payload: bytes, properties: Properties | None) -> None:
        """Raise ``Unsendable`` for a PUBLISH that a conforming MQTT 5 server must refuse: control
        characters in its topic or properties, more bytes than the server's Maximum Packet Size (from its
        CONNACK). Topic aliases are never used, so the server's Topic Alias Maximum cannot be exceeded."""
        user_properties = list(getattr(properties, "UserProperty", None) or ())
        content_type = getattr(properties, "ContentType", None)
        packed = properties.pack() if properties is not None else None
        if packed is None and self.settings.protocol == "5":
            packed = b"\0"  # paho sends an empty property block
        size = publish_size(topic, len(payload), packed)
        problem = upstream_problem(topic, user_properties, content_type, size, self._max_packet)
        if problem is not None:
            raise Unsendable(problem.detail, [])

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        """Publish with at most ``_in_flight_limit()`` unacknowledged; stop handing out PUBLISHes once
        ``preempt`` is set. Returns how many messages (a prefix of ``batch``) are done: acknowledged, or
        expired before their turn came.

        Expiry is judged again for every PUBLISH, at the moment it is handed to the link (the moment
        ``gw-sent-ms`` records): on a slow link a batch that was live when the pump read it can outlast
        a message's TTL while it waits for the window, and an expired message never goes on the wire.

        A PUBLISH the server refuses, or that cannot be sent at all, stops the handing out; the PUBLISHes
        already in flight are still waited for, and the failure (``Refused``, ``Unsendable``) names what
        was acknowledged, wherever it sits, so that only the refused message is sent again. A connection
        lost names the messages in flight (``SendFailed.in_flight``)."""
        client = self._client
        if client is None or not self._ready.is_set():
            raise SendFailed("upstream not connected")
        assert self._loop is not None
        sent_at = self._loop.time()
        futures: list[asyncio.Future[float]] = []
        sizes: list[int] = []
        ack_times: list[float] = []
        published: list[list[QueuedMessage]] = []  # the live messages each PUBLISH carried
        completes: list[int] = []  # how many messages of ``batch`` each PUBLISH's ack completes
        expired_run = 0  # expired messages skipped since the last PUBLISH handed out
        finished = False
        acked: list[int] = []
        acked_set: set[int] = set()
        refused: list[int] = []
        refusal = ""
        unsendable: Unsendable | None = None

        async def next_ack() -> None:
            nonlocal refusal
            index = len(ack_times)
            try:
                ack_times.append(await futures[index])
                acked.extend(item.seq for item in published[index])
                acked_set.update(item.seq for item in published[index])
            except Refused as exc:
                assert self._loop is not None
                ack_times.append(self._loop.time())  # an answer all the same: the link carried it
                refused.extend(item.seq for item in published[index])
                refusal = refusal or exc.reason

        groups = self._groups(batch)
        filled = len(groups) >= self._in_flight_limit()  # the window, not the queue, bounded this batch
        try:
            for items in groups:
                while len(futures) - len(ack_times) >= self._in_flight_limit():
                    await next_ack()
                    self.estimate.record_progress(sizes[: len(ack_times)], ack_times, sent_at=sent_at)
                if preempt.is_set() or refused:
                    break
                if client is not self._client:
                    raise SendFailed(f"upstream connection lost: {self._lost_reason}", link_dropped=self._lost_blames)
                sent_ms = int(time.time() * 1000)
                live = [item for item in items if item.expires_ms > sent_ms]
                if not live:
                    expired_run += len(items)
                    continue
                try:
                    topic, payload, properties = self._unit(live, sent_ms)
                    self._check_unit(topic, payload, properties)
                    info = client.publish(topic, payload, qos=1, properties=properties)
                except Exception as exc:  # this one message cannot go: the others still do
                    reason = exc.reason if isinstance(exc, Unsendable) else f"{type(exc).__name__}: {exc}"
                    if len(live) > 1:  # which of the packed messages it is would be a guess: the pump finds it
                        raise RuntimeError(f"a PUBLISH of {len(live)} messages cannot be sent: {reason}") from exc
                    unsendable = Unsendable(reason, [item.seq for item in live])
                    break
                if info.rc != mqtt.MQTT_ERR_SUCCESS:
                    raise SendFailed(f"publish failed: {mqtt.error_string(info.rc)}")
                # Registered before the loop can read the PUBACK (paho reads only in _readable, on this thread).
                future: asyncio.Future[float] = self._loop.create_future()
                self._pending[info.mid] = future
                futures.append(future)
                sizes.append(wire_size(topic, payload, properties))
                published.append(live)
                completes.append(expired_run + len(items))
                expired_run = 0
            else:
                finished = True
            while len(ack_times) < len(futures):
                await next_ack()
        except SendFailed as exc:
            _abandon_acks(futures)
            in_flight = [item.seq for items in published[len(ack_times):] for item in items]
            raise SendFailed(exc.reason, acked, in_flight, exc.link_dropped) from None
        except BaseException:  # a cancelled pump too: its acks are nobody's to wait for any more
            _abandon_acks(futures)
            raise
        self.stats.bytes_sent += sum(item.size for items in published for item in items if item.seq in acked_set)
        if refused:
            raise Refused(refusal, refused, acked)
        if unsendable is not None:
            raise Unsendable(unsendable.reason, unsendable.seqs, acked)
        self.estimate.record(sizes, ack_times, sent_at, filled and finished)  # a preempted batch did not fill it
        messages = sum(completes) + (expired_run if finished else 0)
        self.stats.rate_bytes_per_s = self.estimate.rate_bytes_per_s
        self.stats.rtt_s = self.estimate.rtt_s
        return messages
