"""Status LEDs, button and relay on gpiozero's own MockFactory: real gpiozero, mock pins.

Blink timings are read from the pins' state history (the time since the previous change). gpiozero blinks
from a thread on the real clock, so a loaded machine can only make a change late, never early: each interval
is held to its lower bound strictly, and the quickest of several like intervals to the rhythm (a blink that
was slow or fast by design differs by 5x; a late wake-up of one change does not move the quickest).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from gpiozero.pins.mock import MockFactory, MockPin

from appliance.hardware.config import GpioConfig
from appliance.hardware.gpio import (
    FAST_BLINK,
    SLOW_BLINK,
    BacklogLevel,
    ModemPowerRelay,
    StatusPanel,
    backlog_level,
)
from testing.waiting import wait_until

POWER, UPLINK, BACKLOG, BUTTON, RELAY = 17, 27, 22, 23, 24


class Presses:
    def __init__(self) -> None:
        self.short = threading.Event()
        self.long = threading.Event()
        self.short_count = 0
        self.long_at: float | None = None

    def on_short(self) -> None:
        self.short_count += 1
        self.short.set()

    def on_long(self) -> None:
        self.long_at = time.monotonic()
        self.long.set()


@pytest.fixture
def presses() -> Presses:
    return Presses()


@pytest.fixture
def panel(factory: MockFactory, presses: Presses) -> Iterator[StatusPanel]:
    config = GpioConfig(
        enabled=True,
        power_led=POWER,
        uplink_led=UPLINK,
        backlog_led=BACKLOG,
        button=BUTTON,
        modem_relay=RELAY,
        long_press_seconds=0.3,
        backlog_slow_from=1,
        backlog_fast_from=100,
    )
    status_panel = StatusPanel(config, on_short_press=presses.on_short, on_long_press=presses.on_long)
    yield status_panel
    status_panel.close()


def wait_for_states(pin: MockPin, count: int, timeout: float = 5.0) -> None:
    wait_until(lambda: len(pin.states) >= count, timeout, lambda: f"pin reached only {len(pin.states)} states")


#: gpiozero's own tolerance for a change on time; a change may come later than that on a busy machine.
EARLY_S = 0.05
#: How far the quickest of several like intervals may be from the rhythm.
RHYTHM_S = 0.15


def assert_blinks(pin: MockPin, first: bool, on: float, off: float, changes: int) -> None:
    """The pin went off, then ``first``, then alternated ``changes`` times with the given on/off times."""
    states = pin.states[: changes + 2]
    assert [s.state for s in states] == [False] + [first if i % 2 == 0 else not first for i in range(changes + 1)]
    intervals = {True: [], False: []}  # by the state the pin left
    for before, change in zip(states[1:], states[2:], strict=False):
        intervals[before.state].append(change.timestamp)
    for state, expected in ((True, on), (False, off)):
        assert all(t >= expected - EARLY_S for t in intervals[state]), (state, intervals)
        if intervals[state]:
            assert min(intervals[state]) <= expected + RHYTHM_S, (state, intervals)


def test_power_led_blinks_slowly_while_starting_then_stays_on_when_ready(factory: MockFactory, panel: StatusPanel) -> None:
    pin = factory.pin(POWER)
    wait_for_states(pin, 6)
    on, off = SLOW_BLINK
    assert_blinks(pin, True, on, off, 4)
    panel.show_ready()
    pin.clear_states()
    time.sleep(on + off)  # a whole blink period: a steady LED changes nothing in it
    assert pin.state is True and len(pin.states) == 1


def test_uplink_led_follows_the_link(factory: MockFactory, panel: StatusPanel) -> None:
    pin = factory.pin(UPLINK)
    panel.show_uplink(True)
    assert pin.state is True
    panel.show_uplink(False)
    assert pin.state is False


def test_backlog_led_is_off_then_blinks_slow_then_fast(factory: MockFactory, panel: StatusPanel) -> None:
    pin = factory.pin(BACKLOG)
    panel.show_backlog(0)
    assert pin.state is False and len(pin.states) == 1
    panel.show_backlog(5)
    wait_for_states(pin, 5)
    assert_blinks(pin, True, *SLOW_BLINK, 3)
    panel.show_backlog(0)
    assert pin.state is False
    pin.clear_states()
    panel.show_backlog(500)
    wait_for_states(pin, 8)
    on, off = FAST_BLINK
    assert_blinks(pin, True, on, off, 6)
    seen = len(pin.states)
    panel.show_backlog(501)  # same level: the blink keeps its rhythm instead of restarting
    wait_for_states(pin, seen + 1)
    assert pin.states[seen].timestamp <= max(on, off) + RHYTHM_S + 0.35  # a restart would begin with a 0 s change
    assert pin.states[seen].timestamp >= min(on, off) - EARLY_S


def test_a_short_press_asks_for_status_and_no_reset(factory: MockFactory, panel: StatusPanel, presses: Presses) -> None:
    button = factory.pin(BUTTON)
    button.drive_low()
    button.drive_high()
    assert presses.short.wait(2.0)
    assert presses.short_count == 1 and not presses.long.is_set()


def test_a_long_press_fires_the_reset_once_after_the_hold_time(factory: MockFactory, panel: StatusPanel, presses: Presses) -> None:
    button = factory.pin(BUTTON)
    pressed_at = time.monotonic()
    button.drive_low()
    assert presses.long.wait(3.0)
    assert presses.long_at is not None
    assert presses.long_at - pressed_at >= 0.3 - EARLY_S  # never before the hold time; late only by load
    button.drive_high()
    time.sleep(0.05)  # release handling is synchronous in MockPin; this only lets a stray thread show up
    assert presses.short_count == 0


@pytest.mark.parametrize("active_high", [True, False])
def test_relay_power_cycle_cuts_power_for_the_configured_time(factory: MockFactory, active_high: bool) -> None:
    relay = ModemPowerRelay(RELAY, active_high=active_high)
    pin = factory.pin(RELAY)
    try:
        assert relay.powered and pin.state is active_high
        pin.clear_states()
        asyncio.run(relay.power_cycle(0.2))
        assert relay.powered
        assert [state.state for state in pin.states] == [active_high, not active_high, active_high]
        assert pin.states[1].timestamp <= EARLY_S  # cut at once
        assert pin.states[2].timestamp >= 0.2 - EARLY_S  # off for the whole time asked (longer only by load)
    finally:
        relay.close()


def test_pins_left_out_of_the_config_are_not_driven(factory: MockFactory) -> None:
    panel = StatusPanel(GpioConfig(enabled=True, uplink_led=UPLINK), on_short_press=lambda: None, on_long_press=lambda: None)
    try:
        panel.show_ready()
        panel.show_backlog(10_000)
        panel.show_uplink(True)
        assert panel.relay is None
        assert factory.pin(UPLINK).state is True
        assert factory.pin(POWER).function == "input"  # never claimed
    finally:
        panel.close()


@pytest.mark.parametrize(
    ("queued", "level"),
    [
        (0, BacklogLevel.EMPTY),
        (1, BacklogLevel.BACKLOG),
        (99, BacklogLevel.BACKLOG),
        (100, BacklogLevel.LARGE),
    ],
)
def test_backlog_level_thresholds(queued: int, level: BacklogLevel) -> None:
    assert backlog_level(queued, slow_from=1, fast_from=100) is level

