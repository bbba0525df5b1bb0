"""paho-mqtt on the gateway's event loop: one MQTT connection on a socket opened without blocking.

The mechanism under the ``$upstream`` bridge, as umqtt.simple is under umqtt.robust: it opens a socket,
runs one paho client on it and reports what happens. When to connect, how long a silence may last and
how much may be in flight are the policy's (``upstream.py``), which it hears through ``LinkEvents``.

Rules
-----
* Every paho call runs on the event loop; there is no network thread. paho's write routine has no lock,
  so a second thread writing from its output queue would swap or interleave adjacent PUBLISHes. paho 2's
  external-loop hooks (``on_socket_open``/``close``/``register_write``/``unregister_write``) put its socket
  on ``loop.add_reader``/``add_writer``; ``loop_read`` and ``loop_write`` run from those callbacks. A
  PUBLISH is queued by ``publish()`` and written by ``loop_write`` in queue order, on one thread.
* paho's ``connect()`` would resolve, connect and shake hands (TLS) blocking: ``open_socket`` does those
  with asyncio, each within ``CONNECT_TIMEOUT_S``, and ``PahoConnection`` hands paho the connected socket
  (``_ConnectedClient``, the one paho internal overridden).
* A ``PahoConnection`` serves one connection and is then dropped: paho would otherwise replay its own
  in-flight copies on reconnect while the pump sends the batch again.
* The kernel is asked, not guessed: ``send_queue_bytes`` (``TIOCOUTQ``) and ``acked_bytes``
  (``tcpi_bytes_acked``) tell the policy whether the link still carries our bytes, and
  ``retransmission_floor_s`` what the route's retransmission floor is.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import ssl
import struct
import termios
from typing import Any, Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties

from appliance.forwarding.config import UpstreamConfig
from appliance.tcp_floor import retransmission_floor_s

#: Seconds for the TCP connect and for the TLS handshake, each.
CONNECT_TIMEOUT_S = 10.0


def connect_failure_reason(exc: BaseException) -> str:
    """What an operator reads in the log: "Connection refused", not "Connect call failed (...)"."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
    if isinstance(exc, OSError) and exc.errno and not isinstance(exc, ssl.SSLError):
        return f"{os.strerror(exc.errno)} ({exc})"
    return str(exc) or type(exc).__name__


def tls_context(settings: UpstreamConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
    if settings.cert_file:
        context.load_cert_chain(str(settings.cert_file), str(settings.key_file) if settings.key_file else None)
    if settings.tls_insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def open_socket(host: str, port: int, tls: ssl.SSLContext | None) -> Any:
    """A connected TCP socket (TLS-wrapped with the handshake done), opened without blocking the loop."""
    loop = asyncio.get_running_loop()
    failure: Exception = OSError(f"no address for {host}")
    for family, kind, proto, _, address in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), CONNECT_TIMEOUT_S)
            if tls is None:
                return sock
            return await asyncio.wait_for(_handshake(sock, tls, host), CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            sock.close()
            failure = exc
        except BaseException:  # cancelled (the bridge stops): no socket left behind
            sock.close()
            raise
    raise failure


async def _handshake(sock: socket.socket, tls: ssl.SSLContext, host: str) -> ssl.SSLSocket:
    wrapped = tls.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    while True:
        try:
            wrapped.do_handshake()
            return wrapped
        except ssl.SSLWantReadError:
            await _fd_ready(wrapped, write=False)
        except ssl.SSLWantWriteError:
            await _fd_ready(wrapped, write=True)


async def _fd_ready(sock: Any, write: bool) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(sock, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(sock)


def send_queue_bytes(sock: Any) -> int | None:
    """Bytes in the socket's send queue, not yet acknowledged by TCP (Linux ``TIOCOUTQ``); None if unknown."""
    try:
        queued: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return None
    return queued


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
    if len(info) < _TCP_INFO_BYTES_ACKED.size:
        return None
    acked: int = _TCP_INFO_BYTES_ACKED.unpack(info)[0]
    return acked


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
        return bool(self._ping_t > 0)

    def _create_socket(self) -> Any:
        sock, self._connected_socket = self._connected_socket, None
        if sock is None:
            raise OSError("no connected socket to hand to paho")
        return sock


class PublishNotQueued(Exception):
    """paho did not queue a PUBLISH (its return code says why): the connection is unusable."""


class LinkEvents(Protocol):
    """What a ``PahoConnection`` reports, on the event loop, to the policy that owns it."""

    def data_arrived(self, connection: PahoConnection) -> None:
        """Bytes can be read from the socket (before paho reads them)."""

    def connection_answered(self, connection: PahoConnection, reason: Any, properties: Any) -> None:
        """The CONNACK, accepting or refusing (paho's ``on_connect``)."""

    def connection_lost(self, connection: PahoConnection, reason: Any, properties: Any) -> None:
        """paho saw the connection end (its ``on_disconnect``: a DISCONNECT, or its socket closed)."""

    def publish_answered(self, connection: PahoConnection, mid: int, reason: Any) -> None:
        """The PUBACK of the PUBLISH ``mid`` (its reason code may refuse it)."""

    def connection_failed(self, connection: PahoConnection, reason: str) -> None:
        """Reading or writing the socket failed: the connection is of no further use."""


class PahoConnection:
    """One MQTT connection: a fresh paho client on ``sock``, its socket hooked to the running loop."""

    def __init__(self, settings: UpstreamConfig, client_id: str, sock: Any, events: LinkEvents) -> None:
        self.settings = settings
        self.events = events
        self._loop = asyncio.get_running_loop()
        self.socket: Any = None  # the client's socket while it is open
        #: Set once the socket is closed, by paho or by ``close``.
        self.closed = asyncio.Event()
        v5 = settings.protocol == "5"
        client = _ConnectedClient(
            mqtt.CallbackAPIVersion.VERSION2,  # type: ignore[attr-defined]
            client_id=client_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            clean_session=None if v5 else True,
        )
        client.max_inflight_messages_set(65535)
        client.max_queued_messages_set(0)
        if settings.username is not None:
            client.username_pw_set(settings.username, settings.password)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_socket_register_write
        client.on_socket_unregister_write = self._on_socket_unregister_write
        client.use_socket(sock)
        self.client = client

    # -- commands of the policy

    def connect(self) -> None:
        """Queue the CONNECT (paho's path, on the socket handed over)."""
        self.client.connect(self.settings.host or "", self.settings.port, keepalive=self.settings.keepalive_s)

    def publish(self, topic: str, payload: bytes, properties: Properties | None = None) -> int:
        """Queue a QoS 1 PUBLISH; its packet id. Raises what paho raises for a message it cannot encode, and
        ``PublishNotQueued`` when the connection cannot take it."""
        info = self.client.publish(topic, payload, qos=1, properties=properties)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise PublishNotQueued(mqtt.error_string(info.rc))
        return info.mid

    def disconnect(self) -> None:
        """A polite DISCONNECT, written when the socket takes it."""
        self.client.disconnect()

    def output_pending(self) -> bool:
        """Bytes of ours not yet acknowledged by the peer's TCP, or not yet written, or a PINGREQ unanswered."""
        queued = send_queue_bytes(self.socket) if self.socket is not None else None
        return self.client.want_write() or bool(queued) or self.client.awaiting_pingresp

    def acked_bytes(self) -> int | None:
        return acked_bytes(self.socket) if self.socket is not None else None

    def retransmission_floor_s(self) -> float | None:
        """The floor TCP retransmits above on this connection's route (``appliance/tcp_floor.py``: the image
        sizes it for the slowest uplink); None where the kernel does not say."""
        return retransmission_floor_s(self.socket) if self.socket is not None else None

    def ping_if_due(self) -> bool:
        """paho's keep-alive rule (a PINGREQ when idle for a keep-alive); False when its PINGRESP is overdue."""
        return self.client.loop_misc() == mqtt.MQTT_ERR_SUCCESS

    def close(self) -> None:
        """Unhook and close the socket without asking paho (whose ``disconnect`` waits for the peer)."""
        sock = self.socket
        if sock is not None:
            self._loop.remove_reader(sock)
            self._loop.remove_writer(sock)
            sock.close()
            self.socket = None
        self.closed.set()

    # -- paho's socket hooks and callbacks (all on the event loop)

    def _on_socket_open(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self.socket = sock
        self._loop.add_reader(sock, self._readable)

    def _on_socket_close(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        if sock.fileno() >= 0:  # an abandoned client's socket is closed already (its __del__ closes it again)
            self._loop.remove_reader(sock)
            self._loop.remove_writer(sock)
        if self.socket is sock:
            self.socket = None
        self.closed.set()

    def _on_socket_register_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self._loop.add_writer(sock, self._writable)

    def _on_socket_unregister_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self._loop.remove_writer(sock)

    def _readable(self) -> None:
        self.events.data_arrived(self)
        rc = self.client.loop_read()
        # TLS: a record may hold more than paho read; those bytes wait in the SSL object with the fd quiet.
        while rc == mqtt.MQTT_ERR_SUCCESS and isinstance(self.socket, ssl.SSLSocket) and self.socket.pending():
            rc = self.client.loop_read()
        if rc != mqtt.MQTT_ERR_SUCCESS:
            self.events.connection_failed(self, f"read: {mqtt.error_string(rc)}")

    def _writable(self) -> None:
        rc = self.client.loop_write()
        if rc != mqtt.MQTT_ERR_SUCCESS:
            self.events.connection_failed(self, f"write: {mqtt.error_string(rc)}")

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self.events.connection_answered(self, reason, properties)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self.events.connection_lost(self, reason, properties)

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        self.events.publish_answered(self, mid, reason)
