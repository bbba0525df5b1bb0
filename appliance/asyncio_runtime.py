"""``runtime.Runtime`` on an asyncio event loop: the production clock and scheduler of the gateway.

The only module of ``appliance/`` that reads the system clocks and sleeps (``runtime.py`` says why).
``wall_clock`` is the same clock for code that runs off the loop (the store threads, a command's
process), where a loop's time cannot be read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def wall_clock() -> float:
    """Wall-clock UNIX seconds, readable from any thread."""
    return time.time()


class AsyncioRuntime:
    """Binds to the running loop on first use (the broker is built before the loop runs its ``start``)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    #: The clocks themselves, as static methods: ``runtime.now()`` is then one C call with no Python frame
    #: around it (the broker reads both on every wake-up; bench/RESULTS.md, "Issue 30, session 15").
    #: ``monotonic`` is the clock, not ``loop.time()``: uvloop's is the time its loop iteration began, in
    #: whole milliseconds, and the bridge measures acks and the pump the gap between batches within one.
    now = staticmethod(time.time)
    monotonic = staticmethod(time.monotonic)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        self.loop.call_soon(callback, *args)

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> asyncio.TimerHandle:
        return self.loop.call_later(delay, callback, *args)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def sleep(self, delay: float) -> Awaitable[None]:
        return asyncio.sleep(delay)

    def timeout(self, delay: float) -> asyncio.Timeout:
        return asyncio.timeout(delay)

    def run_blocking(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        return self.loop.run_in_executor(None, fn, *args)

    def waiter(self) -> asyncio.Future[None]:
        return self.loop.create_future()

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
