"""``appliance.runtime.Runtime`` on a clock that moves only when a test says so: one for every layer.

Rules
-----
* Time never passes by itself: ``advance(seconds)`` (or ``elapse`` on an event loop) moves the clock and
  fires the timers that fall due on the way, each at its own time, in order. A 30 s keep-alive, a 5 s
  backoff ceiling or an hour-long expiry sweep then take microseconds, and a test that asserts "not
  before the deadline" is exact, not a real-time bound that a busy machine breaks.
* Monotonic time starts at ``start`` (0 by default), wall time at ``WALL_CLOCK_START + start``; both move
  together.

Theory of operation
-------------------
Two drivers, one clock and one timer heap:

* Without a loop (the broker's ``BrokerPair``): the fake runtime drives coroutines itself (``spawn``),
  which may await ``sleep``, ``run_blocking``, ``waiter`` and each other (``FakeFuture``). ``run``,
  ``step`` and ``advance`` run what became ready.
* On an asyncio loop (``FakeRuntime(loop=...)``, for services that also do real I/O: sockets, a store
  thread, a serial port): ``sleep`` and ``waiter`` hand out the loop's futures, ``spawn`` makes a task,
  and only the timers are fake. ``await elapse(seconds)`` moves the clock timer by timer and lets the
  loop run what each one woke before the next fires; ``await sleeper()`` waits (on an event, not by
  polling) until some coroutine sleeps on the fake clock; ``run_until`` jumps from timer to timer until
  a condition holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: Wall-clock time at which every fake clock starts (2023-11-14); monotonic time starts at 0.
WALL_CLOCK_START = 1_700_000_000.0
#: Loop turns ``settle`` gives the tasks woken by one timer before it looks again (they may chain).
SETTLE_TURNS = 1000
#: Real seconds ``sleeper`` waits for a coroutine to sleep before the test fails (a bound, not a proof).
SLEEPER_TIMEOUT_S = 20.0


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


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # cancelled meanwhile (the sleeper's task was)
        future.set_result(None)


class FakeRuntime:
    """``appliance.runtime.Runtime`` on a clock that moves only when told to."""

    def __init__(self, start: float = 0.0, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.time = start
        self.loop = loop
        self._ready: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._order = itertools.count()
        self._tasks: set[Coroutine[Any, Any, None]] = set()  # coroutine objects (``cr_running``)
        self._loop_tasks: set[asyncio.Task[None]] = set()
        self._timer_added = asyncio.Event() if loop is not None else None

    @classmethod
    def on_running_loop(cls, start: float = 0.0) -> FakeRuntime:
        """A fake clock for services on the running asyncio loop (sockets, threads and serial ports real)."""
        return cls(start, asyncio.get_running_loop())

    # -- Runtime ----------------------------------------------------------------------------------------

    def now(self) -> float:
        return WALL_CLOCK_START + self.time

    def monotonic(self) -> float:
        return self.time

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        if self.loop is not None:
            self.loop.call_soon(callback, *args)
        else:
            self._ready.append((callback, args))

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> FakeTimer:
        timer = FakeTimer(callback, args)
        heapq.heappush(self._timers, (self.time + max(0.0, delay), next(self._order), timer))
        if self._timer_added is not None:
            self._timer_added.set()
        return timer

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        if self.loop is not None:
            task = self.loop.create_task(coroutine)
            self._loop_tasks.add(task)
            task.add_done_callback(self._loop_tasks.discard)
            return
        self._tasks.add(coroutine)
        self.call_soon(self._step, coroutine)

    def sleep(self, delay: float) -> Awaitable[None]:
        if self.loop is not None:
            waiting: asyncio.Future[None] = self.loop.create_future()
            timer = self.call_later(delay, _resolve, waiting)
            waiting.add_done_callback(lambda _: timer.cancel())  # a cancelled sleeper leaves no live timer
            return waiting
        future: FakeFuture[None] = FakeFuture()
        self.call_later(delay, future.set_result, None)
        return future

    @contextlib.asynccontextmanager
    async def timeout(self, delay: float) -> AsyncIterator[None]:
        """``asyncio.timeout`` whose deadline is on the fake clock (on a loop only)."""
        assert self.loop is not None, "timeout is for a FakeRuntime on a loop"
        loop = self.loop
        async with asyncio.timeout(None) as deadline:
            timer = self.call_later(delay, lambda: deadline.reschedule(loop.time()))
            try:
                yield
            finally:
                timer.cancel()

    def run_blocking(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        if self.loop is not None:
            done: asyncio.Future[T] = self.loop.create_future()
            done.set_result(fn(*args))
            return done
        future: FakeFuture[T] = FakeFuture()
        self.call_soon(lambda: future.set_result(fn(*args)))
        return future

    def waiter(self) -> Any:
        return self.loop.create_future() if self.loop is not None else FakeFuture()

    def close(self) -> None:
        for task in list(self._loop_tasks):
            task.cancel()
        for coroutine in list(self._tasks):
            if not getattr(coroutine, "cr_running", False):  # the one calling close (``Broker.stop``) ends by itself
                coroutine.close()
                self._tasks.discard(coroutine)

    # -- driving, without a loop ------------------------------------------------------------------------

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

    # -- driving, on an asyncio loop --------------------------------------------------------------------

    @property
    def next_deadline(self) -> float | None:
        """When the earliest live timer fires (monotonic), None without one."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def deadlines(self) -> list[float]:
        """When each live timer fires (monotonic), earliest first: which coroutines sleep until when."""
        return sorted(when for when, _, timer in self._timers if not timer.cancelled)

    async def settle(self) -> None:
        """Let the loop run what is ready (and what that makes ready) before the clock moves on."""
        assert self.loop is not None, "settle is for a FakeRuntime on a loop"
        ready = getattr(self.loop, "_ready", None)
        for _ in range(SETTLE_TURNS):
            await asyncio.sleep(0)
            if ready is not None and not ready:
                return

    async def elapse(self, seconds: float) -> None:
        """``advance`` on a loop: each timer due within ``seconds`` fires at its own time, and the tasks it
        woke run (and may sleep again, within the same span) before the next one."""
        target = self.time + seconds
        await self.settle()
        while (deadline := self.next_deadline) is not None and deadline <= target:
            self.time = max(self.time, deadline)
            self._fire_due(self.time)
            await self.settle()
        self.time = target
        await self.settle()

    async def sleeper(self, timeout: float = SLEEPER_TIMEOUT_S) -> float:
        """Until some coroutine waits on the fake clock (a live timer exists); its deadline. For code that
        first does real I/O (a refused connect, a store thread) and then sleeps."""
        assert self._timer_added is not None, "sleeper is for a FakeRuntime on a loop"
        async with asyncio.timeout(timeout):
            while (deadline := self.next_deadline) is None:
                self._timer_added.clear()
                await self._timer_added.wait()
        return deadline

    async def run_until(self, condition: Callable[[], bool], within: float) -> None:
        """Jump the clock from one timer to the next (each fired at its own time, what it woke run) until
        ``condition()`` holds; fail if that needs more than ``within`` seconds of fake time. Only for code
        whose every wait is on the fake clock meanwhile (a modem that answers nothing, a refused connect)."""
        end = self.time + within
        while True:
            await self.settle()
            if condition():
                return
            deadline = await self.sleeper()
            assert deadline <= end, f"not within {within} s of fake time (next timer at {deadline - self.time:+.3f} s)"
            self.time = max(self.time, deadline)
            self._fire_due(self.time)

    # -- internals --------------------------------------------------------------------------------------

    def _fire_due(self, now: float) -> bool:
        fired = False
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                fired = True
                if self.loop is not None:
                    timer.callback(*timer.args)
                else:
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
