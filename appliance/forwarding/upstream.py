"""The ``$upstream`` endpoint: reconnect and window policy of the MQTT bridge to the cloud broker.

The policy over ``paho_link.py``'s mechanism, as umqtt.robust is over umqtt.simple: this module decides
when to connect, when a link is dead and how much may be in flight; ``PahoConnection`` runs paho on the
event loop and reports what happens. The policy's state is in sans-I/O classes of its own, each with its
tests: the window of the measured link (``window.py``) bounded by the server's limits (``flow_limit.py``),
the books of a batch in flight (``in_flight.py``), keep-alive (``liveness.py``); this class is the asyncio
around them. Measurements and the history of these rules: docs/forwarding.md
("Upstream bridge: why it is built so").

Rules
-----
* QoS 1, and a message counts as sent only once its PUBACK (and those of the messages before it) is in:
  the pump takes messages off their queue after that, never before (at-least-once; the message id is
  stable across retries).
* In flight: in the ``message`` format at most ``estimate.window()`` PUBLISHes unacknowledged, in the
  ``batch`` format (``upstream_publish.py`` says what goes in a PUBLISH) a window's worth of packed
  PUBLISHes; never more than the server's Receive Maximum (``flow_limit.py``).
* Expiry is judged again for every PUBLISH as it is handed to the link: an expired message never goes on
  the wire.
* Reconnecting: exponential backoff with jitter, and a fresh ``PahoConnection`` per connection.
* Keep-alive (``liveness.py``): while PUBLISHes or a PINGREQ are in flight, a link that still makes
  progress (PUBACKs, TCP acknowledging our bytes) within 1.5 keep-alives plus one step of the link is
  alive however slow; paho's PINGREQ rule runs only while nothing is in flight. The CONNACK has
  ``CONNECT_TIMEOUT_S``.
* ``set_link(False)`` (the modem is not registered) closes the connection and no attempt is made until
  ``set_link(True)``, which also skips any backoff still running.
* Time comes from the ``Runtime`` port: the tick, the backoff and every clock reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.backoff import Backoff
from appliance.forwarding.config import UpstreamConfig
from appliance.forwarding.endpoints import Refused, SendFailed, Unsendable
from appliance.forwarding.flow_limit import FlowLimit
from appliance.forwarding.in_flight import BatchInFlight
from appliance.forwarding.liveness import Liveness
from appliance.forwarding.metrics import LinkStats
from appliance.forwarding.paho_link import (
    CONNECT_TIMEOUT_S,
    PahoConnection,
    PublishNotQueued,
    connect_failure_reason,
    open_socket,
    tls_context,
)
from appliance.forwarding.queues import QueuedMessage
from appliance.forwarding.routes import UPSTREAM
from appliance.forwarding.upstream_publish import PublishFormat, wire_size
from appliance.forwarding.window import LinkEstimate, Window
from appliance.runtime import Runtime, wall_ms

if TYPE_CHECKING:  # the TLS context is made by the mechanism (``paho_link.tls_context``)
    import ssl

log = logging.getLogger(__name__)


#: How often keep-alive (liveness and paho's PINGREQ) is looked at.
TICK_S = 0.25
#: How long a DISCONNECT may take to leave before the socket is simply closed.
CLOSE_TIMEOUT_S = 1.0


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
    """The bridge's policy; ``LinkEvents`` of the ``PahoConnection`` it has open (one at a time)."""

    def __init__(self, settings: UpstreamConfig, gateway_id: str, stats: LinkStats,
                 runtime: Runtime | None = None) -> None:
        assert settings.host is not None
        self.id = UPSTREAM
        self.settings = settings
        self.gateway_id = gateway_id
        self.stats = stats
        self.format = PublishFormat(settings, gateway_id)
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self.estimate = LinkEstimate()
        self.limit = FlowLimit(settings, self.estimate)
        self._ready = asyncio.Event()
        self._stopping = False
        self._link_up = True
        # Set on every change of the link state or on stop: a connection or a backoff wait ends early.
        self._link_changed = asyncio.Event()
        self.on_connection_change: Callable[[bool], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._connection: PahoConnection | None = None
        self._liveness: Liveness | None = None
        self._pending: dict[int, asyncio.Future[float]] = {}
        # Jittered, so a fleet that lost the same cloud at the same moment does not come back in step.
        self._backoff = Backoff(settings.backoff_min_s, settings.backoff_max_s, random.Random())
        self._ready_flag = False
        # Why the last connection ended, and whether that blames the messages in flight (not when the
        # bridge closed it itself: a stop, the modem reporting the link down).
        self._lost_reason = ""
        self._lost_blames = False
        self._answered = False  # the current connection got its CONNACK (accepting or refusing)
        self._tls: ssl.SSLContext | None = None
        self.connects = 0

    @property
    def _socket(self) -> Any:
        """The open connection's socket, if any (the HIL bench reads its TCP state)."""
        return self._connection.socket if self._connection is not None else None

    # -- lifecycle

    def start(self) -> None:
        if self.settings.tls:
            self._tls = tls_context(self.settings)
        self._task = asyncio.create_task(self._run(), name="forwarding-upstream")

    async def stop(self) -> None:
        """A polite DISCONNECT when connected; a connect attempt in progress is abandoned."""
        self._stopping = True
        self._link_changed.set()
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                async with self.runtime.timeout(CLOSE_TIMEOUT_S + 2 * TICK_S):
                    await asyncio.wait({self._task})  # a wait cut short leaves the task running
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
                assert self.settings.host is not None
                sock = await open_socket(self.settings.host, self.settings.port, self._tls)
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
                await self._wait(self._link_changed, self._backoff.next_delay())

    async def _session(self, sock: Any) -> bool:
        """Run one MQTT connection on ``sock`` until it closes, the link goes down or the bridge stops.
        True if the upstream accepted it (CONNACK), so the backoff starts over."""
        connection = PahoConnection(self.settings, self.settings.client_id or self.gateway_id, sock, self)
        self._connection = connection
        self._answered = False
        self._liveness = Liveness(self.settings.keepalive_s, self.runtime.monotonic(), CONNECT_TIMEOUT_S)
        accepted = False
        try:
            connection.connect()
            while not connection.closed.is_set():
                if self._stopping or not self._link_up:
                    connection.disconnect()  # a polite DISCONNECT if it leaves soon; the socket is closed anyway
                    await self._wait(connection.closed, CLOSE_TIMEOUT_S)
                    break
                await self._wait(connection.closed, TICK_S)
                accepted = accepted or self._ready_flag
                if not connection.closed.is_set():
                    self._tick(connection)
        finally:
            self._abandon(connection)
        return accepted

    async def _wait(self, event: asyncio.Event, seconds: float) -> None:
        """Until ``event`` is set or ``seconds`` have passed on the runtime's clock. ``runtime.timeout``, not
        ``wait_for``: on 3.11 ``wait_for`` can drop a ``stop()``'s cancellation."""
        with contextlib.suppress(TimeoutError):
            async with self.runtime.timeout(seconds):
                await event.wait()

    def _tick(self, connection: PahoConnection) -> None:
        """Keep-alive (``liveness.py``): busy, the link must make progress; before the CONNACK, its timeout;
        idle, paho's PINGREQ/PINGRESP rule."""
        assert self._liveness is not None
        # A PINGREQ out counts as data in flight: its PINGRESP may take a round trip longer than the
        # keep-alive (paho's rule), on a satellite link or behind a frame on a slow one.
        busy = bool(self._pending) or connection.output_pending()
        dead = self._liveness.dead(self.runtime.monotonic(), busy, connection.acked_bytes(),
                                   self.estimate.progress_step_s(), self._ready_flag)
        if dead is not None:
            self._abandon(connection, dead)
            return
        if self._ready_flag and not busy and not connection.ping_if_due():
            self._abandon(connection, "keep-alive: no PINGRESP")

    def _abandon(self, connection: PahoConnection, reason: str | None = None) -> None:
        """Drop the connection without asking paho: unhook and close its socket; a fresh one comes next.
        Logs ``upstream disconnected`` as paho's callback does, when paho has not said so already. Without
        a ``reason`` the bridge closes it by its own choice (a stop, the link down): nothing is blamed."""
        blames = reason is not None and not self._closing_by_choice()
        current = self._connection is connection
        if current and self._ready_flag:
            self._lost(reason or "closed by the bridge", blames)
        elif current and blames and not self._answered:  # failed before its CONNACK
            log.warning("upstream %s:%s: connection failed before the CONNACK: %s", self.settings.host,
                        self.settings.port, reason)
        if current:
            connection.close()
            self._connection = None
        connection.closed.set()
        self._set_ready(False)

    def _closing_by_choice(self) -> bool:
        return self._stopping or not self._link_up

    def _lost(self, reason: str, blames: bool) -> None:
        """The connection ended: logged at WARNING unless the bridge ended it (a stop, the link down)."""
        self._lost_reason, self._lost_blames = reason, blames
        log.log(logging.WARNING if blames else logging.INFO, "upstream disconnected: %s", reason)

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

    # -- LinkEvents: what the open connection reports (on the event loop)

    def data_arrived(self, connection: PahoConnection) -> None:
        if connection is self._connection and self._liveness is not None:
            self._liveness.received(self.runtime.monotonic())

    def connection_failed(self, connection: PahoConnection, reason: str) -> None:
        if connection is self._connection:
            self._abandon(connection, reason)

    def connection_answered(self, connection: PahoConnection, reason: Any, properties: Any) -> None:
        self._answered = True
        if reason.is_failure:
            log.warning("upstream %s:%s refused the connection: %s (0x%02X)%s", self.settings.host, self.settings.port,
                        reason, reason.value, "" if self.settings.username is None else f" for user {self.settings.username!r}")
            connection.disconnect()
            return
        self.connects += 1
        self._set_ready(True)  # a new connection for the estimate: the round trip below belongs to it
        assert self._liveness is not None
        self.estimate.note_round_trip(self.runtime.monotonic() - self._liveness.started_at)
        self.limit.connected(getattr(properties, "MaximumPacketSize", None), getattr(properties, "ReceiveMaximum", None))
        floor = connection.retransmission_floor_s()
        log.info("upstream connected to %s:%s (retransmission floor %s)", self.settings.host, self.settings.port,
                 "unknown" if floor is None else f"{floor:.2f} s")

    def connection_lost(self, connection: PahoConnection, reason: Any, properties: Any) -> None:
        if connection is not self._connection:
            return
        if self._ready_flag:
            server_says = getattr(properties, "ReasonString", None)
            self._lost(f"{reason}" + (f" ({server_says})" if server_says else ""), not self._closing_by_choice())
        self._set_ready(False)

    def publish_answered(self, connection: PahoConnection, mid: int, reason: Any) -> None:
        future = self._pending.pop(mid, None)
        if future is None or future.done() or connection is not self._connection:
            return
        if getattr(reason, "is_failure", False):
            future.set_exception(Refused(f"{reason} (0x{reason.value:02X})"))
        else:
            future.set_result(self.runtime.monotonic())

    # -- EndpointSender

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def topic_for(self, item: QueuedMessage) -> str:
        return self.format.topic_for(item)

    def publish_direct(self, topic: str, payload: bytes) -> None:
        """Fire-and-forget QoS 1 (gateway metrics): skipped while disconnected, never queued."""
        connection = self._connection
        if connection is not None and self._ready.is_set():
            with contextlib.suppress(PublishNotQueued):
                connection.publish(topic, payload)

    def window(self) -> Window:
        return self.limit.window()

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        """Publish with at most ``limit.in_flight()`` unacknowledged; stop handing out PUBLISHes once
        ``preempt`` is set. Returns how many messages (a prefix of ``batch``) are done: acknowledged, or
        expired before their turn came.

        Expiry is judged again for every PUBLISH, at the moment it is handed to the link (the moment
        ``gw-sent-ms`` records): on a slow link a batch that was live when the pump read it can outlast
        a message's TTL while it waits for the window, and an expired message never goes on the wire.

        A PUBLISH the server refuses, or that cannot be sent at all, stops the handing out; the PUBLISHes
        already in flight are still waited for, and the failure (``Refused``, ``Unsendable``) names what
        was acknowledged, wherever it sits, so that only the refused message is sent again. A connection
        lost names the messages in flight (``SendFailed.in_flight``)."""
        connection = self._connection
        if connection is None or not self._ready.is_set():
            raise SendFailed("upstream not connected")
        books = BatchInFlight(self.runtime.monotonic())
        futures: list[asyncio.Future[float]] = []  # the PUBACK of each PUBLISH handed out
        finished = False
        unsendable: Unsendable | None = None

        async def next_answer() -> None:
            future = futures[len(books.ack_times)]
            try:
                books.answered(await future)
            except Refused as exc:  # an answer all the same: the link carried it
                books.answered(self.runtime.monotonic(), exc.reason)

        groups = self.format.groups(batch, self.window().chunk_bytes)
        filled = len(groups) >= self.limit.in_flight()  # the window, not the queue, bounded this batch
        try:
            for items in groups:
                while books.unanswered >= self.limit.in_flight():  # re-read after every ack: it follows the link
                    await next_answer()
                    self.estimate.record_progress(books.answered_sizes(), books.ack_times, sent_at=books.sent_at)
                if preempt.is_set() or books.refused:
                    break
                if connection is not self._connection:
                    raise SendFailed(f"upstream connection lost: {self._lost_reason}", link_dropped=self._lost_blames)
                sent_ms = wall_ms(self.runtime)
                live = [item for item in items if item.expires_ms > sent_ms]
                if not live:
                    books.skipped_expired(len(items))
                    continue
                try:
                    topic, payload, properties = self.format.unit(live, sent_ms)
                    self.format.check(topic, payload, properties, self.limit.max_packet)
                    mid = connection.publish(topic, payload, properties)
                except PublishNotQueued as exc:
                    raise SendFailed(f"publish failed: {exc}") from None
                except Exception as exc:  # this one message cannot go: the others still do
                    reason = exc.reason if isinstance(exc, Unsendable) else f"{type(exc).__name__}: {exc}"
                    if len(live) > 1:  # which of the packed messages it is would be a guess: the pump finds it
                        raise RuntimeError(f"a PUBLISH of {len(live)} messages cannot be sent: {reason}") from exc
                    unsendable = Unsendable(reason, [item.seq for item in live])
                    break
                # Registered before the loop can read the PUBACK (paho reads only in _readable, on this thread).
                future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
                self._pending[mid] = future
                futures.append(future)
                books.handed_out(live, len(items), wire_size(topic, payload, properties))
            else:
                finished = True
            while books.unanswered:
                await next_answer()
        except SendFailed as exc:
            _abandon_acks(futures)
            raise SendFailed(exc.reason, books.acked, books.in_flight_seqs(), exc.link_dropped) from None
        except BaseException:  # a cancelled pump too: its acks are nobody's to wait for any more
            _abandon_acks(futures)
            raise
        self.stats.bytes_sent += books.acked_bytes()
        if books.refused:
            raise Refused(books.refusal, books.refused, books.acked)
        if unsendable is not None:
            raise Unsendable(unsendable.reason, unsendable.seqs, books.acked)
        # A preempted batch did not fill the window.
        self.estimate.record(books.sizes, books.ack_times, books.sent_at, filled and finished)
        self.stats.rate_bytes_per_s = self.estimate.rate_bytes_per_s
        self.stats.rtt_s = self.estimate.rtt_s
        return books.done(finished)
