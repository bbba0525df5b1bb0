from __future__ import annotations

import pytest

from appliance.hardware.backoff import Backoff


def test_doubles_up_to_the_ceiling_and_resets() -> None:
    backoff = Backoff(1.0, 5.0)
    assert [backoff.next_delay() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.next_delay() == 1.0


@pytest.mark.parametrize(("initial", "maximum"), [(0.0, 1.0), (2.0, 1.0)])
def test_rejects_nonsense(initial: float, maximum: float) -> None:
    with pytest.raises(ValueError):
        Backoff(initial, maximum)
