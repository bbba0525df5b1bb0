"""The gateway's port to time and scheduling: what its logic may ask of the event loop, and nothing else.

Rules
-----
* No module of ``appliance/`` reads a clock or sleeps by itself (``time.time``, ``time.monotonic``,
  ``asyncio.sleep``, ``loop.time``): the broker, forwarding, the state store, the firmware service and the
  hardware get the clock and the scheduler through one ``Runtime``, built once by ``gateway.serve``.
  ``tests/test_runtime_port.py`` checks it; the adapters (``asyncio_runtime.py``) and the few exceptions
  it lists are the only readers.
* Two clocks, on purpose: ``now()`` is wall-clock UNIX seconds, for every value that is persisted or
  leaves the process (expiry times, HLC timestamps, ``gw-sent-ms``), because it must survive a restart;
  ``monotonic()`` measures intervals (keep-alive, backoffs, health) and never jumps.

Theory of operation
-------------------
``Runtime`` is a Protocol, so the asyncio loop in production (``AsyncioRuntime``) and the fake clock of
the tests (``testing/fake_runtime.py``) both fit without inheritance. Will delay, session expiry,
keep-alive, backoffs and blink patterns are then tested in milliseconds: the test moves the fake clock
instead of waiting (Azure IoT Edge injects its ``ISystemTime`` the same way).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Generator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Timer(Protocol):
    def cancel(self) -> None: ...


class Waiter(Protocol):
    """A result some callback sets later; a spawned coroutine awaits it (an asyncio future)."""

    def set_result(self, result: None) -> None: ...

    def __await__(self) -> Generator[Any, None, None]: ...


class Runtime(Protocol):
    def now(self) -> float:
        """Wall-clock UNIX seconds (persisted times: expiry, will delay)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (intervals: keep-alive, flapping)."""

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback`` after the current batch, in this loop turn's order."""

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        """Run ``callback`` ``delay`` seconds from now (monotonic)."""

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a coroutine to its end; the runtime keeps it referenced and cancels it on ``close``."""

    def sleep(self, delay: float) -> Awaitable[None]:
        """For a spawned coroutine: resume ``delay`` seconds later (0: after the other ready work)."""

    def timeout(self, delay: float) -> AbstractAsyncContextManager[object]:
        """For a coroutine: a block that is cancelled after ``delay`` seconds and then raises ``TimeoutError``
        (``asyncio.timeout``'s contract: a cancellation from outside still propagates)."""

    def run_blocking(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        """Run ``fn`` where it cannot stall the loop (a worker thread) and await its result."""

    def waiter(self) -> Waiter:
        """A fresh ``Waiter``: for a coroutine that waits its turn in a queue (``login_gate``)."""

    def close(self) -> None:
        """Cancel what ``spawn`` started and is still running."""


def wall_ms(runtime: Runtime) -> int:
    """``runtime.now()`` in whole UNIX milliseconds: the unit of persisted and exported times."""
    return int(runtime.now() * 1000)
