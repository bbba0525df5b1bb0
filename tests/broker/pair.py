"""A broker core and fake clients that speak bytes, on a fake clock: h11's ``ConnectionPair`` for MQTT.

``BrokerPair`` builds the real ``Broker`` (real codec, sessions, router, store) with ``FakeRuntime`` as
its clock and scheduler. ``FakeClient`` is the socket layer's side of one connection: ``send`` feeds
encoded packets to ``Broker.data_received`` and runs what became ready; what the broker writes is parsed
back with the codec's reader. Nothing opens a socket and nothing waits: ``advance(seconds)`` moves the
clock and fires the timers that fall due on the way, in order, so a 30 s keep-alive takes microseconds.

The fake runtime drives coroutines itself (``spawn``): they may await ``sleep``, ``run_blocking`` and
each other, which is all the broker core awaits when it has no services.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import Any, Generic, TypeVar

from appliance.broker.broker import Broker
from appliance.broker.codec import packets as pk
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.writer import encode
from appliance.broker.config import BrokerConfig, LimitsConfig, ListenerConfig
from appliance.broker.persistence.store import BrokerStore
from appliance.broker.security.acl import Acl
from appliance.broker.security.auth import Authenticator
from appliance.broker.sessions.session import ClientConnection

T = TypeVar("T")

#: Wall-clock time at which every fake clock starts (2023-11-14); monotonic time starts at 0.
WALL_CLOCK_START = 1_700_000_000.0


class FakeFuture(Generic[T]):
    def __init__(self) -> None:
        self.done = False
        self.result: Any = None
        self._callbacks: list[Callable[[], None]] = []

    def set_result(self, value: T) -> None:
        self.done = True
        self.result = value
        for callback in self._callbacks:
            callback()

    def __await__(self) -> Generator[FakeFuture[T], None, T]:
        if not self.done:
            yield self
        return self.result  # type: ignore[no-any-return]


class FakeTimer:
    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeRuntime:
    """``appliance.runtime.Runtime`` on a clock that moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self.time = start
        self._ready: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._order = itertools.count()
        self._tasks: set[Coroutine[Any, Any, None]] = set()

    def now(self) -> float:
        return WALL_CLOCK_START + self.time

    def monotonic(self) -> float:
        return self.time

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        self._ready.append((callback, args))

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> FakeTimer:
        timer = FakeTimer(callback, args)
        heapq.heappush(self._timers, (self.time + max(0.0, delay), next(self._order), timer))
        return timer

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self._tasks.add(coroutine)
        self.call_soon(self._step, coroutine)

    def sleep(self, delay: float) -> FakeFuture[None]:
        future: FakeFuture[None] = FakeFuture()
        self.call_later(delay, future.set_result, None)
        return future

    def run_blocking(self, fn: Callable[..., T], *args: Any) -> FakeFuture[T]:
        future: FakeFuture[T] = FakeFuture()
        self.call_soon(lambda: future.set_result(fn(*args)))
        return future

    def waiter(self) -> FakeFuture[None]:
        return FakeFuture()

    def close(self) -> None:
        for coroutine in list(self._tasks):
            if not coroutine.cr_running:  # the one calling close (``Broker.stop``) ends by itself
                coroutine.close()
                self._tasks.discard(coroutine)

    # -- driving --------------------------------------------------------------------------------------

    def run(self) -> None:
        """Run everything ready now (what it schedules with ``call_soon`` too), and timers already due."""
        while True:
            while self._ready:
                callback, args = self._ready.popleft()
                callback(*args)
            if not self._fire_due(self.time):
                return

    def step(self) -> None:
        """One event-loop iteration: the callbacks ready now (not those they schedule), then due timers."""
        for _ in range(len(self._ready)):
            callback, args = self._ready.popleft()
            callback(*args)
        self._fire_due(self.time)

    def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds``, firing every timer due on the way at its own time."""
        target = self.time + seconds
        self.run()
        while self._timers and self._timers[0][0] <= target:
            self.time = max(self.time, self._timers[0][0])
            self.run()
        self.time = target
        self.run()

    def complete(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to its end at the current time (``Broker.start``/``stop``)."""
        box: list[T] = []

        async def wrapper() -> None:
            box.append(await coroutine)

        self.spawn(wrapper())
        self.run()
        assert box, "the coroutine waits for something only time can bring; use advance()"
        return box[0]

    def _fire_due(self, now: float) -> bool:
        fired = False
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                fired = True
                self.call_soon(timer.callback, *timer.args)
        return fired

    def _step(self, coroutine: Coroutine[Any, Any, None]) -> None:
        try:
            awaited = coroutine.send(None)
        except StopIteration:
            self._tasks.discard(coroutine)
            return
        if not isinstance(awaited, FakeFuture):
            raise TypeError(f"a coroutine on the fake runtime awaited {awaited!r}")
        awaited._callbacks.append(lambda: self.call_soon(self._step, coroutine))


class FakeClient:
    """One client connection as the socket layer would present it (``broker.link.Link``)."""

    def __init__(self, pair: BrokerPair, level: int, name: str) -> None:
        self.pair = pair
        self.level = level
        limits = pair.broker.limits
        self.connection = ClientConnection(limits.max_packet_size, limits.topic_alias_maximum, name)
        self.connection.link = self
        self.reader = PacketReader(protocol_level=level)
        self.inbox: list[pk.Packet] = []
        self.raw = bytearray()
        self.holds: set[str] = set()
        self.closed = False
        #: The client closed its socket but the broker, not reading, has not noticed (``peer_closed``).
        self.left_unnoticed = False
        self.writes_after_close = 0
        pair.broker.connection_made(self)

    # -- the Link side (called by the broker) ----------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.closed:
            self.writes_after_close += 1
            return
        self.raw += data
        self.inbox += self.reader.feed(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pair.runtime.call_soon(self.pair.broker.connection_lost, self)

    def hold_reading(self, reason: str, held: bool) -> None:
        if held:
            self.holds.add(reason)
        else:
            self.holds.discard(reason)

    def peer_closed(self) -> bool:
        return self.closed or self.left_unnoticed

    # -- the test's side -------------------------------------------------------------------------------

    def send(self, *packets: pk.Packet | bytes) -> None:
        """Send ``packets`` in ONE read (as one TCP segment would arrive) and run what became ready."""
        self.arrive(*packets)
        self.pair.runtime.run()

    def arrive(self, *packets: pk.Packet | bytes) -> None:
        """Like ``send``, but run nothing that became ready: the test steps the loop (``FakeRuntime.step``)."""
        data = b"".join(p if isinstance(p, bytes) else encode(p, self.level) for p in packets)
        self.pair.broker.data_received(self, data)

    def received(self) -> list[pk.Packet]:
        """Every packet that arrived since the last call."""
        packets, self.inbox = self.inbox, []
        return packets

    def expect(self, kind: type[T]) -> T:
        packets = self.received()
        assert len(packets) == 1 and isinstance(packets[0], kind), f"expected one {kind.__name__}, got {packets!r}"
        return packets[0]

    def connect(self, client_id: str, clean_start: bool = True, keep_alive: int = 0, **kwargs: Any) -> pk.Connack:
        self.send(pk.Connect(self.level, client_id, clean_start, keep_alive, **kwargs))
        return self.expect(pk.Connack)

    def subscribe(self, topic_filter: str, qos: int = 0, packet_id: int = 1) -> pk.Suback:
        self.send(pk.Subscribe(packet_id, [pk.SubscribeRequest(topic_filter, qos)]))
        return self.expect(pk.Suback)

    def drop(self) -> None:
        """The network connection breaks (no DISCONNECT)."""
        self.closed = True
        self.pair.broker.connection_lost(self)
        self.pair.runtime.run()

    def congest(self, congested: bool) -> None:
        """The socket layer's flow control: the write buffer went over (or back under) its high-water mark."""
        self.connection.congested = congested
        if not congested:
            self.connection.overloaded = False
        self.pair.broker.congestion_changed(self, congested)
        self.pair.runtime.run()


class BrokerPair:
    """``Broker`` + ``FakeRuntime`` + as many ``FakeClient``s as a test opens."""

    def __init__(self, data_dir: Path | None = None, acl: Acl | None = None,
                 authenticator: Authenticator | None = None, clock_start: float = 0.0, **limits: Any) -> None:
        """``clock_start``: seconds after ``WALL_CLOCK_START`` at which this broker's clock starts."""
        self._rebuild = (data_dir, acl, authenticator, limits)
        self.runtime = FakeRuntime(clock_start)
        self.store = BrokerStore.open(data_dir / "broker.db") if data_dir is not None else None
        config = BrokerConfig((ListenerConfig("tcp", "fake", 0),), limits=LimitsConfig(**{"sys_interval": 0, **limits}))
        self.broker = Broker(config, self.store, authenticator or Authenticator(None, True), acl, runtime=self.runtime)
        self.runtime.complete(self.broker.start())
        self._names = itertools.count(1)

    def client(self, level: int = pk.MQTT_5) -> FakeClient:
        return FakeClient(self, level, f"fake:{next(self._names)}")

    def advance(self, seconds: float) -> None:
        self.runtime.advance(seconds)

    def killed(self, down_for: float) -> BrokerPair:
        """kill -9 and a restart ``down_for`` seconds later: this broker stops running where it is (no
        shutdown, no wills, its timers never fire, what it did not commit is lost with its database
        connection) and a new one starts on the same data dir, its clock that much later."""
        data_dir, acl, authenticator, limits = self._rebuild
        assert data_dir is not None, "a broker without a data dir has nothing to restart from"
        if self.store is not None:
            self.store.close()
        return BrokerPair(data_dir, acl, authenticator, clock_start=self.runtime.time + down_for, **limits)

    def stop(self) -> None:
        self.runtime.complete(self.broker.stop())
        if self.store is not None:
            self.store.close()
