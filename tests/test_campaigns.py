"""Every property campaign with a count of its own takes it through `testing.campaigns.campaign`.

A bare ``settings(max_examples=...)`` outranks the ``check`` profile, so one such campaign in the unit layer
runs in full under ``make check`` and slows the inner loop for everyone; this keeps them out.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from testing.campaigns import CHECK_PROFILE

ROOT = Path(__file__).resolve().parents[1]
BARE_COUNT = re.compile(r"(^\s*@|=\s*)settings\([^)]*max_examples\s*=")
#: The firmware's live campaigns run in the process layer and size themselves per test.
EXEMPT = {"tests/device_firmware/test_hostile_values.py"}


def test_campaign_counts_go_through_campaign() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in EXEMPT
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if BARE_COUNT.search(line)
    ]
    assert not offenders, offenders


@given(st.integers())
def test_an_example_has_no_wall_time_deadline(value: int) -> None:
    """Hypothesis' default 200 ms per example is a real-time bound: under load it failed properties that
    hold. The suite's profiles (``suite``, and ``check`` on top of it) have none."""
    assert settings().deadline is None
    assert settings.get_profile(CHECK_PROFILE).deadline is None
