"""The clocks of code that has no event loop: the command-line tools and the devices' blocking state
store client.

With ``asyncio_runtime.py`` (the ``Runtime`` adapter of everything that runs on the loop) this is the only
module of ``appliance/`` that reads the system clocks or sleeps; ``runtime.py`` says why time is an input.
A blocking process cannot take its time from a loop, so it takes it from a ``BlockingClock``.
"""

from __future__ import annotations

import threading
import time


class BlockingClock:
    """Monotonic seconds for deadlines, wall milliseconds for stamps, a sleep that blocks the thread, and a
    wait for an event that a deadline cuts short."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        """Block until ``event`` is set (True) or ``seconds`` have passed on this clock (False)."""
        return event.wait(seconds)


#: The system's clocks.
SYSTEM_CLOCK = BlockingClock()
