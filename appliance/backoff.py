"""Exponential backoff with a ceiling, as a value with no clock: the caller sleeps, this only counts. The
one backoff of the gateway: the modem's power cycles, the upstream bridge's reconnects and the forwarding
pumps' retries all use it.

Doubling from ``initial`` up to ``maximum`` and resetting on success retries a peer that recovers soon
and stops hammering one that stays dead (a modem power-cycled every few seconds wears its relay and flash,
and some networks bar a device that re-attaches too often). With an ``rng``, each delay is "equal
jitter": half of the nominal delay fixed, half drawn at random, so a fleet that lost the same cloud at the
same moment does not come back in step, while no wait is ever shorter than half the nominal one.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError(f"need 0 < initial <= maximum, got {initial}, {maximum}")
        self._initial = initial
        self._maximum = maximum
        self._rng = rng
        self._next = initial

    def next_delay(self) -> float:
        nominal = self._next
        self._next = min(self._next * 2, self._maximum)
        if self._rng is None:
            return nominal
        return nominal / 2 + self._rng.uniform(0, nominal / 2)

    def reset(self) -> None:
        self._next = self._initial
