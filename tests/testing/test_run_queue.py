"""`testing.run_queue`: the interval it reports a wait for always contains the one asked about."""

from __future__ import annotations

import os
import threading

import pytest

from testing.run_queue import RunQueueWait, waited_ns


def samples(*pairs: tuple[float, float]) -> RunQueueWait:
    waits = RunQueueWait(pid=0)
    for stamp, waited in pairs:
        waits.stamps.append(stamp)
        waits.waited_s.append(waited)
    return waits


def test_the_wait_is_read_over_the_samples_that_bracket_the_interval() -> None:
    waits = samples((10.0, 1.0), (10.5, 1.2), (11.0, 1.9), (11.5, 2.0))
    assert waits.between(10.5, 11.0) == pytest.approx(0.7)  # samples exactly at both ends
    assert waits.between(10.6, 10.9) == pytest.approx(0.7)  # widened to 10.5..11.0, never narrowed
    assert waits.between(10.0, 11.5) == pytest.approx(1.0)
    assert waits.since(10.7) == pytest.approx(0.8)  # from 10.5 to the latest sample


@pytest.mark.parametrize(("start", "end"), [(9.9, 10.4), (10.6, 11.6)])
def test_an_interval_the_samples_do_not_reach_is_an_error_not_a_guess(start: float, end: float) -> None:
    with pytest.raises(ValueError, match="no samples around"):
        samples((10.0, 1.0), (10.5, 1.2), (11.5, 2.0)).between(start, end)


def test_the_counter_of_a_running_thread_never_goes_backwards() -> None:
    pid, tid = os.getpid(), threading.get_native_id()
    first = waited_ns(pid, tid)
    assert waited_ns(pid, tid) >= first >= 0
