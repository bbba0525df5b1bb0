"""How long a thread of another process waited for a CPU, for real-time tests that judge that process.

A real process that is late on a busy machine is late for one of two reasons: its own work (a blocked
event loop, the defect a test looks for) or the scheduler (it was runnable but the CPUs ran other
processes: the machine's load, not the code under test). The kernel counts the second one per thread:
``/proc/PID/task/TID/schedstat`` holds the nanoseconds the thread has run and the nanoseconds it has
waited on a run queue (Linux's Documentation/scheduler/sched-stats.rst). A test that samples that count
around an interval can take the waiting out of what it measures and judge only the process's own delay.

Theory of operation: a thread of the test process reads the counter every `SAMPLE_PERIOD_S` and stamps
each read with ``time.time()`` (the clock socket timestamps such as ``SO_TIMESTAMPNS`` use). The wait
over an interval is read between the last sample at or before its start and the first at or after its
end: the bracket contains the interval, so the figure is never less than the true wait in it. A sampler
that is itself starved only widens the bracket, which makes the allowance larger, never a false failure.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

#: How often the counter is read: fine enough that a bracket adds little to the interval it encloses.
SAMPLE_PERIOD_S = 0.01


def waited_ns(pid: int, tid: int | None = None) -> int:
    """The nanoseconds thread ``tid`` of ``pid`` (its main thread by default) has waited on a run queue."""
    path = Path(f"/proc/{pid}/task/{tid if tid is not None else pid}/schedstat")
    try:
        _ran, waited, _slices = path.read_text().split()
    except FileNotFoundError:
        if not Path("/proc/self/schedstat").exists():
            raise RuntimeError("this kernel keeps no scheduler statistics (/proc/PID/schedstat, CONFIG_SCHED_INFO)") from None
        raise
    return int(waited)


class RunQueueWait:
    """Samples, stamped with ``time.time()``, of how long one thread had waited for a CPU so far."""

    def __init__(self, pid: int, tid: int | None = None) -> None:
        self.pid = pid
        self.tid = tid
        self.stamps: list[float] = []
        self.waited_s: list[float] = []
        self._lock = threading.Lock()

    def sample(self) -> None:
        waited = waited_ns(self.pid, self.tid) / 1e9
        with self._lock:
            self.stamps.append(time.time())
            self.waited_s.append(waited)

    def between(self, start: float, end: float) -> float:
        """Seconds the thread waited for a CPU over a span of samples that contains [start, end] (wall
        clock): at least the true wait in it. Raises if the samples do not reach both ends."""
        with self._lock:
            first = bisect.bisect_right(self.stamps, start) - 1
            last = bisect.bisect_left(self.stamps, end)
            if first < 0 or last >= len(self.stamps):
                raise ValueError(f"no samples around [{start}, {end}]: sampled {self.stamps[:1]}..{self.stamps[-1:]}")
            return self.waited_s[last] - self.waited_s[first]

    def since(self, start: float) -> float:
        """Seconds the thread waited for a CPU from the last sample at or before ``start`` to the latest
        sample: for a process that has exited since (its counter is gone with it)."""
        with self._lock:
            first = bisect.bisect_right(self.stamps, start) - 1
            if first < 0:
                raise ValueError(f"no sample at or before {start}: sampled from {self.stamps[:1]}")
            return self.waited_s[-1] - self.waited_s[first]


@contextlib.contextmanager
def sampling(pid: int, tid: int | None = None) -> Iterator[RunQueueWait]:
    """Sample the run-queue wait of thread ``tid`` of ``pid`` while the block runs, and once more after it
    (so an interval that ends in the block is closed by a sample)."""
    waits = RunQueueWait(pid, tid)
    stop = threading.Event()
    waits.sample()

    def sampler() -> None:
        while not stop.wait(SAMPLE_PERIOD_S):
            with contextlib.suppress(FileNotFoundError):  # the process has exited
                waits.sample()

    thread = threading.Thread(target=sampler, name="run-queue-wait-sampler", daemon=True)
    thread.start()
    try:
        yield waits
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(FileNotFoundError):
            waits.sample()
