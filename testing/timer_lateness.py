"""How late a timer wakes up on this machine right now, for the real-time tests that remain.

A real-time bound written as a fixed number holds on a quiet machine and fails on a busy one. A test that
must judge a period in real time (a blinking LED, watchdog pings of a real process) samples beside it how
late a plain sleep of the same length wakes up, and adds that lateness to its bound: the bound then
follows the machine's load instead of guessing it.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Iterator


class TimerLateness:
    """Samples of how much later than asked a ``time.sleep(interval)`` returned, taken on a thread."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.samples: list[float] = []

    def median(self) -> float:
        """The typical lateness; 0 before any sample (a probe that never woke up saw no load to add)."""
        return statistics.median(self.samples) if self.samples else 0.0


@contextlib.contextmanager
def probing(interval: float) -> Iterator[TimerLateness]:
    """Sample the lateness of ``interval``-second sleeps while the block runs, on a thread of this process
    (as niced as the processes it started)."""
    lateness = TimerLateness(interval)
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            asked = time.monotonic()
            time.sleep(interval)
            lateness.samples.append(time.monotonic() - asked - interval)

    thread = threading.Thread(target=probe, name="timer-lateness-probe", daemon=True)
    thread.start()
    try:
        yield lateness
    finally:
        stop.set()
        thread.join()
