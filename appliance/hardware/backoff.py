"""Exponential backoff with a ceiling, as a value with no clock: the caller sleeps, this only counts.

A modem that stays dead after a power cycle must not be power-cycled every few seconds (that wears the
relay and the modem's flash, and some networks bar a device that re-attaches too often), yet one that
recovers should be tried again soon. Doubling from ``initial`` up to ``maximum`` and resetting on success
gives both.
"""

from __future__ import annotations


class Backoff:
    def __init__(self, initial: float, maximum: float) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError(f"need 0 < initial <= maximum, got {initial}, {maximum}")
        self._initial = initial
        self._maximum = maximum
        self._next = initial

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self._maximum)
        return delay

    def reset(self) -> None:
        self._next = self._initial
