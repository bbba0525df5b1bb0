from __future__ import annotations

import random

import pytest

from appliance.backoff import Backoff


def test_doubles_up_to_the_ceiling_and_resets() -> None:
    backoff = Backoff(1.0, 5.0)
    assert [backoff.next_delay() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.next_delay() == 1.0


def test_jitter_keeps_each_delay_between_half_and_all_of_its_nominal_value() -> None:
    backoff = Backoff(0.5, 30, random.Random(1))
    delays = [backoff.next_delay() for _ in range(10)]
    nominal = [min(30.0, 0.5 * 2**n) for n in range(10)]
    assert all(n / 2 <= d <= n for d, n in zip(delays, nominal, strict=True)), delays
    assert len({round(d, 6) for d in delays}) == len(delays), "jittered"


@pytest.mark.parametrize(("initial", "maximum"), [(0.0, 1.0), (2.0, 1.0)])
def test_rejects_nonsense(initial: float, maximum: float) -> None:
    with pytest.raises(ValueError):
        Backoff(initial, maximum)
