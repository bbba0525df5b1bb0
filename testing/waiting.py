"""One way for a test to wait for something: on an event where the code under test offers one, by polling
a real condition with a deadline where it does not.

Three shapes cover the suite:

* `until` — in a coroutine, re-check a condition each loop turn (state that is plain attributes,
  changed by tasks on the same loop);
* `wait_until` — in a thread, re-check a condition with a short backoff (state changed by another thread
  or process: gpiozero's pin history, a file, a log);
* `wait_on` — in a thread, block on a `threading.Condition` that the producer notifies (paho callbacks,
  collectors): no polling at all.

Each raises `WaitTimeout` (an `AssertionError`, so pytest shows it as a failed expectation) naming what was
awaited and, through ``what``, what was seen instead.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

#: The first poll interval and its cap; polling backs off so a long wait costs little CPU.
FIRST_POLL_S = 0.005
MAX_POLL_S = 0.05


class WaitTimeout(AssertionError):
    """The awaited condition did not hold within the deadline."""


def _describe(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what


async def until(condition: Callable[[], bool], timeout: float = 5.0, what: str | Callable[[], str] = "condition") -> None:
    """Return once ``condition()`` holds, checked every loop turn of the running loop; fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = FIRST_POLL_S
    while not condition():
        if loop.time() > deadline:
            raise WaitTimeout(f"{_describe(what)} not met within {timeout:g} s")
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_POLL_S)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0, what: str | Callable[[], str] = "condition") -> None:
    """Return once ``condition()`` holds, polled with backoff from this thread; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = FIRST_POLL_S
    while not condition():
        if time.monotonic() > deadline:
            raise WaitTimeout(f"{_describe(what)} not met within {timeout:g} s")
        time.sleep(delay)
        delay = min(delay * 2, MAX_POLL_S)


def wait_on(
    condition_variable: threading.Condition,
    predicate: Callable[[], bool],
    timeout: float = 5.0,
    what: str | Callable[[], str] = "condition",
) -> None:
    """Block on ``condition_variable`` until ``predicate()`` holds (re-checked on every notify)."""
    with condition_variable:
        if not condition_variable.wait_for(predicate, timeout):
            raise WaitTimeout(f"{_describe(what)} not met within {timeout:g} s")
