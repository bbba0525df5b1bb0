"""A userspace TCP relay that shapes both directions like a slow, lossy uplink.

This is the rig's userspace backend and the tool other tests use to put a bad link between two endpoints
without root. The timing rules live in `shaping` (pure); this module is only the asyncio plumbing:

* each accepted connection gets a connection to the target and, per direction, a *shaper* task (reads one
  segment, waits for the link to be up and for tokens in that direction's bucket, stamps a release time)
  and a *deliverer* task (waits until the release time and for the link to be up, then writes). The two
  are joined by a bounded queue, so bandwidth and delay add up like on a real link: many segments can be
  "in flight" during the delay while the bucket paces new ones;
* the bucket and the byte counters belong to the direction, shared by all connections, because the
  link's capacity is shared; segments take their tokens in the order they reach the bucket (one queue,
  as in tbf), so no connection's segment is passed over by another's smaller ones;
* a settings change wakes every waiter at once (a future per waiter, resolved on change), so `RATE` and
  `UP` take effect immediately instead of after a sleep that was computed under the old settings;
* a connection ends when both directions have delivered their EOF (a FIN is forwarded as a half-close:
  the other side may still be reading), or at once when either socket breaks (a reset, a failed write):
  both sides are then reset and the queued bytes dropped, so a flow nobody can receive never spends the
  shared bucket. All four tasks of a connection are in one task group, so a failed write ends its shaper
  too; a break that no task would see until its next read or write (asyncio stops reading a socket after
  its EOF) comes from the socket itself (`reset_watch`, and the stream's close waiter).

TCP cannot lose bytes, so loss is modelled as TCP would experience it: a lost segment costs one
retransmission timeout and its bytes again from the bucket (see PROTOCOL.md). DOWN stalls every open
connection (nothing is forwarded, nothing is cut) and refuses new ones; `cut()` aborts open connections.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from hil_tests.rig.reset_watch import ResetWatch
from hil_tests.rig.shaping import (
    DeliveryClock,
    LinkSettings,
    ThroughputMeter,
    TokenBucket,
    count_losses,
    segment_bytes,
    wire_bytes,
)

__all__ = ["DirectionStats", "LinkSettings", "Relay", "RelayStats", "RelayThread"]

T = TypeVar("T")
# Segments that may wait for delivery per connection and direction; bounds memory when a receiver stalls.
QUEUE_SEGMENTS = 256
_EOF = b""  # queued after the last segment: the deliverer half-closes the far side


@dataclass(frozen=True)
class DirectionStats:
    bytes_forwarded: int
    throughput_bps: float


@dataclass(frozen=True)
class RelayStats:
    """``upstream`` is client -> target (gateway -> cloud), ``downstream`` the way back."""

    upstream: DirectionStats
    downstream: DirectionStats
    connections_open: int
    connections_total: int
    connections_refused: int


class _Direction:
    """What one direction of the link shares across connections: its bucket, the turn to use it, and its
    counters."""

    def __init__(self, settings: LinkSettings, now: float) -> None:
        self.bucket = TokenBucket(settings, now)
        # Segments take their tokens in the order they reached the bucket, as packets leave tbf's one
        # queue: without it a segment read at a higher rate waited for more tokens than the bucket ever
        # held while another connection took each of its smaller segments as soon as it fitted.
        self.turn = asyncio.Lock()  # FIFO: a release wakes the longest waiter
        self.meter = ThroughputMeter()
        self.bytes_forwarded = 0

    def delivered(self, nbytes: int, now: float) -> None:
        self.bytes_forwarded += nbytes
        self.meter.add(nbytes, now)

    def stats(self, now: float) -> DirectionStats:
        return DirectionStats(self.bytes_forwarded, self.meter.bits_per_second(now))


class _Connection:
    """One relayed connection: both stream writers and its tasks, so `cut` or a reset can end it."""

    def __init__(self, client_writer: asyncio.StreamWriter, resets: ResetWatch) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[None]] = []
        self._resets = resets
        self._watched: list[int] = []
        self._on_reset = self.abort  # one bound method: `ResetWatch.forget` tells watches apart by identity
        self._aborted = False
        self.add(client_writer)

    def add(self, writer: asyncio.StreamWriter) -> None:
        """Own ``writer`` (abort and close it with the connection) and end the connection if it resets.
        Raises `ConnectionResetError` if the connection was aborted already (the client reset while the
        relay was connecting to the target)."""
        self.writers.append(writer)
        if self._aborted:
            writer.transport.abort()
            raise ConnectionResetError("the connection was reset while the relay connected to the target")
        fd = writer.get_extra_info("socket").fileno()
        self._resets.watch(fd, self._on_reset)
        self._watched.append(fd)

    def abort(self) -> None:
        """Reset both sides and drop what is queued. Cancelling the tasks, not the handler task, lets the
        handler finish normally (3.11's start_server callback calls task.exception(), which raises on a
        cancelled handler)."""
        self._aborted = True
        self._forget()
        for writer in self.writers:
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()

    def close(self) -> None:
        self._forget()
        for writer in self.writers:
            writer.close()

    def _forget(self) -> None:
        # Before the sockets close: a closed socket's number may be reused by the next connection.
        for fd in self._watched:
            self._resets.forget(fd, self._on_reset)
        self._watched.clear()


class Relay:
    """Listens on ``listen_host`` (port 0 unless given), forwards to the target, shapes per `LinkSettings`."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        settings: LinkSettings | None = None,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        seed: int | None = None,
        socket_factory: Callable[[], socket.socket] | None = None,
        before_connect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``socket_factory`` makes the listening and the outgoing TCP sockets (IPv4), for a relay that
        lives in another network namespace (`namespace_sockets`); by default asyncio makes them here.
        ``before_connect`` is awaited before each connection to the target (the bridge backend puts its
        retransmission floor on the way there)."""
        self.target_host = target_host
        self.target_port = target_port
        self._listen = (listen_host, listen_port)
        self._settings = settings or LinkSettings()
        self._rng = random.Random(seed)
        self._socket_factory = socket_factory
        self._before_connect = before_connect
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._upstream: _Direction | None = None
        self._downstream: _Direction | None = None
        self._waiters: set[asyncio.Future[None]] = set()
        self._resets: ResetWatch | None = None
        # handler task -> its connection; stop() waits for the handlers
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        self._connections_total = 0
        self._connections_refused = 0

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        self._upstream = _Direction(self._settings, now)
        self._downstream = _Direction(self._settings, now)
        self._resets = ResetWatch(self._loop)
        try:
            self._server = await self._listen_for_connections()
        except BaseException:
            self._resets.close()
            self._resets = None
            raise

    async def _listen_for_connections(self) -> asyncio.Server:
        if self._socket_factory is None:
            return await asyncio.start_server(self._accept, *self._listen)
        listener = self._socket_factory()
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(self._listen)
            listener.listen()
        except OSError:
            listener.close()
            raise
        return await asyncio.start_server(self._accept, sock=listener)

    async def _connect_target(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._before_connect is not None:
            await self._before_connect()
        if self._socket_factory is None:
            return await asyncio.open_connection(self.target_host, self.target_port)
        outgoing = self._socket_factory()
        outgoing.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(outgoing, (self.target_host, self.target_port))
        except OSError:
            outgoing.close()
            raise
        return await asyncio.open_connection(sock=outgoing)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("relay not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def host(self) -> str:
        return self._listen[0]

    async def stop(self) -> None:
        """Stop listening and abort every connection; idempotent."""
        if self._server is not None:
            self._server.close()
        self.cut()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._resets is not None:
            self._resets.close()
            self._resets = None

    async def __aenter__(self) -> Relay:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- control ---------------------------------------------------------------------------------------

    @property
    def settings(self) -> LinkSettings:
        return self._settings

    def set(self, **changes: Any) -> LinkSettings:
        """Change link settings (``rate_bps``, ``burst_bytes``, ``delay_ms``, ``jitter_ms``, ``loss_pct``,
        ``up``); raises `SettingsError` and changes nothing if a value is out of range."""
        return self.apply(self._settings.replace(**changes))

    def apply(self, settings: LinkSettings) -> LinkSettings:
        """Replace all settings at once (what the rig does after a command was validated)."""
        self._settings = settings
        if self._loop is not None:
            now = self._loop.time()
            for direction in self._directions():
                direction.bucket.configure(settings, now)
        self._wake_all()
        return settings

    def cut(self) -> int:
        """Abort every open connection (both sides see a reset), as a modem reset would; returns how many."""
        for connection in self._connections.values():
            connection.abort()
        return len(self._connections)

    def stats(self) -> RelayStats:
        now = self._loop.time() if self._loop is not None else 0.0
        upstream, downstream = self._directions()
        return RelayStats(
            upstream=upstream.stats(now),
            downstream=downstream.stats(now),
            connections_open=len(self._connections),
            connections_total=self._connections_total,
            connections_refused=self._connections_refused,
        )

    # -- connections -----------------------------------------------------------------------------------

    def _directions(self) -> tuple[_Direction, _Direction]:
        if self._upstream is None or self._downstream is None:
            raise RuntimeError("relay not started")
        return self._upstream, self._downstream

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if not self._settings.up:
            self._connections_refused += 1
            client_writer.transport.abort()
            return
        assert self._resets is not None
        connection = _Connection(client_writer, self._resets)
        handler = asyncio.current_task()
        assert handler is not None
        self._connections[handler] = connection
        self._connections_total += 1
        try:
            try:
                target_reader, target_writer = await self._connect_target()
            except OSError:
                self._connections_refused += 1
                connection.abort()
                return
            connection.add(target_writer)
            upstream, downstream = self._directions()
            async with asyncio.TaskGroup() as tasks:
                pumps = []
                for reader, writer, direction in (
                    (client_reader, target_writer, upstream),
                    (target_reader, client_writer, downstream),
                ):
                    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_SEGMENTS)
                    pumps.append(tasks.create_task(self._shape(reader, queue, direction)))
                    pumps.append(tasks.create_task(self._deliver(queue, writer, direction)))
                # A socket's close waiter raises the error asyncio saw on it, which the pump that reads
                # it would raise only at its next read (it may be waiting for tokens meanwhile).
                breaks = [tasks.create_task(_until_broken(writer)) for writer in connection.writers]
                connection.tasks += pumps + breaks
                await asyncio.wait(pumps)
                for watcher in breaks:
                    watcher.cancel()
            connection.close()
        except* OSError:
            # One side reset or a write failed: reset the other too, as a broken path would.
            connection.abort()
        finally:
            del self._connections[handler]

    async def _shape(
        self, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]], direction: _Direction
    ) -> None:
        clock = DeliveryClock()
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(segment_bytes(self._settings))
            if not data:
                await queue.put((clock.release_time(loop.time(), self._settings, self._rng, 0), _EOF))
                return
            losses = count_losses(self._settings, self._rng)
            for _ in range(1 + losses):
                await self._transmit(direction, len(data))
            await queue.put((clock.release_time(loop.time(), self._settings, self._rng, losses), data))

    async def _deliver(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter, direction: _Direction
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            release, data = await queue.get()
            while (wait := release - loop.time()) > 0 or not self._settings.up:
                await self._wait_for_change(wait if self._settings.up else None)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()  # raises if the write failed: those bytes were not delivered
            direction.delivered(len(data), loop.time())

    async def _transmit(self, direction: _Direction, nbytes: int) -> None:
        """Wait until the link is up and the direction's bucket holds the wire bytes of ``nbytes`` of
        payload (RATE counts frames, headers included, as tc does), then spend them."""
        loop = asyncio.get_running_loop()
        nbytes = wire_bytes(nbytes)
        due: float | None = None  # when the segment may leave, once it had to wait for tokens
        async with direction.turn:
            while True:
                if not self._settings.up:
                    due = None  # a link that is down sends nothing: no time to make up for after UP
                    await self._wait_for_change(None)
                    continue
                now = loop.time()
                wait = direction.bucket.wait_time(nbytes, now)
                if wait <= 0:
                    direction.bucket.take(nbytes, now, due)
                    return
                due = now + wait
                await self._wait_for_change(wait)

    async def _wait_for_change(self, timeout: float | None) -> None:
        """Sleep ``timeout`` seconds (forever if None) or until the settings change, whichever is first."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(timeout, _resolve, waiter) if timeout is not None else None
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            self._waiters.discard(waiter)
            if timer is not None:
                timer.cancel()

    def _wake_all(self) -> None:
        for waiter in list(self._waiters):
            _resolve(waiter)


async def _until_broken(writer: asyncio.StreamWriter) -> None:
    """Raise the error that breaks ``writer``'s connection; return when the relay closes it."""
    await writer.wait_closed()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class RelayThread:
    """A `Relay` on its own event loop in a background thread, for synchronous tests and programs.

    Every method hands its work to the relay's loop and waits for the answer, so ``set()`` has taken
    effect when it returns.
    """

    def __init__(self, target_host: str, target_port: int, **relay_options: Any) -> None:
        self._relay = Relay(target_host, target_port, **relay_options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    def start(self, timeout: float = 10.0) -> None:
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name="relay", daemon=True)
        self._thread.start()
        started.result(timeout)

    def _run(self, started: concurrent.futures.Future[None]) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            try:
                await self._relay.start()
            except BaseException as exc:
                started.set_exception(exc)
                return
            started.set_result(None)
            try:
                await self._stopped.wait()
            finally:
                await self._relay.stop()

        asyncio.run(main())

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("relay thread not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def port(self) -> int:
        return self._relay.port

    @property
    def host(self) -> str:
        return self._relay.host

    @property
    def settings(self) -> LinkSettings:
        return self._relay.settings

    def set(self, **changes: Any) -> LinkSettings:
        return self._call(_call_sync(self._relay.set, **changes))

    def cut(self) -> int:
        return self._call(_call_sync(self._relay.cut))

    def stats(self) -> RelayStats:
        return self._call(_call_sync(self._relay.stats))

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stopped is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> RelayThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _call_sync(function: Any, *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)
