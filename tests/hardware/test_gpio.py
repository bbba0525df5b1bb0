"""Status LEDs, button and relay on gpiozero's own MockFactory: real gpiozero, mock pins.

Blinking and the relay's off time are timed by the runtime, so they are judged on the fake clock
(``testing/fake_runtime.py``): the test moves it and reads the pin just before and at each change, to the
millisecond, whatever the machine's load. The button's hold time is gpiozero's own (its thread, the real
clock): that check keeps a lower bound only, which load cannot break.
"""

from __future__ import annotations

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
from testing.fake_runtime import FakeRuntime

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
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def panel(factory: MockFactory, presses: Presses, runtime: FakeRuntime) -> Iterator[StatusPanel]:
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
    status_panel = StatusPanel(config, on_short_press=presses.on_short, on_long_press=presses.on_long, runtime=runtime)
    yield status_panel
    status_panel.close()


#: Fake seconds before a change at which the pin still shows the old state.
JUST_BEFORE = 0.001
#: gpiozero's own tolerance for its hold timer firing early (its thread, the real clock).
EARLY_S = 0.05


def assert_blinks(pin: MockPin, runtime: FakeRuntime, on: float, off: float, periods: int) -> None:
    """From now (the blink's start, on first): on for ``on`` seconds, off for ``off``, ``periods`` times."""
    for _ in range(periods):
        for state, span in ((True, on), (False, off)):
            assert pin.state is state
            runtime.advance(span - JUST_BEFORE)
            assert pin.state is state, f"changed before its {span} s were up"
            runtime.advance(JUST_BEFORE)
            assert pin.state is not state, f"not changed after its {span} s"


def test_power_led_blinks_slowly_while_starting_then_stays_on_when_ready(
        factory: MockFactory, panel: StatusPanel, runtime: FakeRuntime) -> None:
    pin = factory.pin(POWER)
    on, off = SLOW_BLINK
    assert_blinks(pin, runtime, on, off, 3)
    panel.show_ready()
    pin.clear_states()
    runtime.advance(10 * (on + off))  # a steady LED changes nothing
    assert pin.state is True and len(pin.states) == 1


def test_uplink_led_follows_the_link(factory: MockFactory, panel: StatusPanel) -> None:
    pin = factory.pin(UPLINK)
    panel.show_uplink(True)
    assert pin.state is True
    panel.show_uplink(False)
    assert pin.state is False


def test_backlog_led_is_off_then_blinks_slow_then_fast(factory: MockFactory, panel: StatusPanel,
                                                        runtime: FakeRuntime) -> None:
    pin = factory.pin(BACKLOG)
    panel.show_backlog(0)
    assert pin.state is False and len(pin.states) == 1
    panel.show_backlog(5)
    assert_blinks(pin, runtime, *SLOW_BLINK, 2)
    panel.show_backlog(0)
    assert pin.state is False
    runtime.advance(5.0)
    assert pin.state is False  # the slow blink stopped with it
    panel.show_backlog(500)
    on, off = FAST_BLINK
    assert_blinks(pin, runtime, on, off, 3)
    runtime.advance(on / 2)
    panel.show_backlog(501)  # same level: the blink keeps its rhythm instead of restarting
    runtime.advance(on / 2 - JUST_BEFORE)
    assert pin.state is True
    runtime.advance(JUST_BEFORE)
    assert pin.state is False  # off when the first on-time was up, not a full on-time after the call


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
    button.drive_high()  # release handling is synchronous in MockPin
    assert presses.short_count == 0


@pytest.mark.parametrize("active_high", [True, False])
def test_relay_power_cycle_cuts_power_for_the_configured_time(factory: MockFactory, runtime: FakeRuntime,
                                                              active_high: bool) -> None:
    relay = ModemPowerRelay(RELAY, active_high=active_high, runtime=runtime)
    pin = factory.pin(RELAY)
    try:
        assert relay.powered and pin.state is active_high
        runtime.spawn(relay.power_cycle(0.2))
        runtime.run()
        assert not relay.powered and pin.state is not active_high  # cut at once
        runtime.advance(0.2 - JUST_BEFORE)
        assert not relay.powered  # off for the whole time asked
        runtime.advance(JUST_BEFORE)
        assert relay.powered and pin.state is active_high
    finally:
        relay.close()


def test_pins_left_out_of_the_config_are_not_driven(factory: MockFactory, runtime: FakeRuntime) -> None:
    panel = StatusPanel(GpioConfig(enabled=True, uplink_led=UPLINK), on_short_press=lambda: None,
                        on_long_press=lambda: None, runtime=runtime)
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

