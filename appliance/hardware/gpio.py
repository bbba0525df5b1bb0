"""Status LEDs, the service button and the modem power relay, through gpiozero.

gpiozero does the pin work (button hold timing, debouncing) and runs the button's callbacks on its own
threads; this module decides *what* the pins show and calls plain callables. The caller
(``HardwareService``) hands in button callbacks that hop onto the event loop with ``call_soon_threadsafe``.
Blinking is timed by the ``Runtime`` port (``Blink``), not by gpiozero's blink thread, so the rhythm is
tested on the fake clock; ``show_*`` and ``close`` are called on the event loop. Tests use gpiozero's own
``MockFactory``, so the pins under test are real gpiozero devices.

What the LEDs mean:

* power/ready: slow blink while the gateway starts, steady once listeners and stores are up;
* uplink: steady while the modem (or other uplink) is registered, off when the link is down;
* backlog: off when nothing waits to be forwarded, slow blink for a backlog, fast blink for a large one.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import tempfile
import warnings
from collections.abc import Callable, Iterator

from gpiozero import LED, Button, Device, OutputDevice
from gpiozero.exc import PinWarning

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.hardware.config import GpioConfig
from appliance.runtime import Runtime, Timer

log = logging.getLogger(__name__)

#: (on seconds, off seconds) of the two blink rates; far enough apart to tell at a glance.
SLOW_BLINK = (0.5, 0.5)
FAST_BLINK = (0.1, 0.1)


class GpioUnavailable(Exception):
    """No pins for the gateway: no pin library works on this machine, or a pin is held by another program."""


@contextlib.contextmanager
def unavailable_as_one_error() -> Iterator[None]:
    """Raise ``GpioUnavailable`` for whatever claiming pins raises: each pin library has its own errors
    (gpiozero's ``BadPinFactory``, ``lgpio.error``, RuntimeError, OSError) and they all mean "no pins". gpiozero
    warns once per library it tries before giving up; those reasons go into the message instead of stderr."""
    with warnings.catch_warnings(record=True) as tried:
        warnings.simplefilter("always", PinWarning)
        try:
            yield
        except Exception as exc:
            reasons = "; ".join(str(warning.message) for warning in tried)
            raise GpioUnavailable(f"{type(exc).__name__}: {exc}{f' ({reasons})' if reasons else ''}") from exc
    for warning in tried:  # pins claimed after a fallback: say which library is in use
        log.info("GPIO: %s", warning.message)


def pin_library() -> str:
    """The pin library gpiozero picks on this machine (``LGPIOFactory``...), loaded and closed again, for
    ``appliance doctor``; raises ``GpioUnavailable`` when none loads."""
    if Device.pin_factory is not None:  # already chosen in this process (tests: MockFactory)
        return type(Device.pin_factory).__name__
    # lgpio makes FIFOs in the working directory: from a read-only one (``cd / && appliance doctor``) it
    # would fail and the answer would be "no GPIO" on a Pi that has it.
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch), unavailable_as_one_error():
        Device.ensure_pin_factory()
    factory = Device.pin_factory
    assert factory is not None
    Device.pin_factory = None
    factory.close()
    return type(factory).__name__


class BacklogLevel(enum.Enum):
    EMPTY = "empty"
    BACKLOG = "backlog"
    LARGE = "large"


def backlog_level(queued: int, slow_from: int, fast_from: int) -> BacklogLevel:
    if queued >= fast_from:
        return BacklogLevel.LARGE
    if queued >= slow_from:
        return BacklogLevel.BACKLOG
    return BacklogLevel.EMPTY


class ModemPowerRelay:
    """The relay in the modem's supply line. Energised (``on``) means the modem has power."""

    def __init__(self, pin: int, active_high: bool, runtime: Runtime | None = None) -> None:
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self._device = OutputDevice(pin, active_high=active_high, initial_value=True)

    @property
    def powered(self) -> bool:
        return bool(self._device.value)

    async def power_cycle(self, off_seconds: float) -> None:
        """Cut the supply, wait ``off_seconds`` so the modem's capacitors drain, restore it."""
        self._device.off()
        try:
            await self.runtime.sleep(off_seconds)
        finally:
            self._device.on()

    def close(self) -> None:
        self._device.close()


class Blink:
    """An LED blinking on the runtime's clock, on first, until ``stop``."""

    def __init__(self, led: LED, on_s: float, off_s: float, runtime: Runtime) -> None:
        self._led = led
        self._on_s, self._off_s = on_s, off_s
        self._runtime = runtime
        self._timer: Timer | None = None
        self._turn(True)

    def _turn(self, on: bool) -> None:
        self._led.value = on
        self._timer = self._runtime.call_later(self._on_s if on else self._off_s, self._turn, not on)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class StatusPanel:
    """The pins of ``[hardware.gpio]``; a pin left out of the config is simply not driven."""

    def __init__(
        self,
        config: GpioConfig,
        on_short_press: Callable[[], object],
        on_long_press: Callable[[], object],
        runtime: Runtime | None = None,
    ) -> None:
        """Claims every configured pin; if one cannot be claimed (no pin library on this machine, a pin
        held by another program) the pins already claimed are released before the error propagates.
        ``runtime`` times the blinking and the relay's power cycle."""
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self._config = config
        self._on_short_press = on_short_press
        self._on_long_press = on_long_press
        self._power: LED | None = None
        self._uplink: LED | None = None
        self._backlog: LED | None = None
        self.relay: ModemPowerRelay | None = None
        self._button: Button | None = None
        self._backlog_shown: BacklogLevel | None = None
        self._blinks: dict[LED, Blink] = {}
        self._held = False
        try:
            self._claim_pins(config)
        except BaseException:
            self.close()
            raise

    def _claim_pins(self, config: GpioConfig) -> None:
        self._power = LED(config.power_led) if config.power_led is not None else None
        self._uplink = LED(config.uplink_led) if config.uplink_led is not None else None
        self._backlog = LED(config.backlog_led) if config.backlog_led is not None else None
        if config.modem_relay is not None:
            self.relay = ModemPowerRelay(config.modem_relay, config.relay_active_high, self.runtime)
        if config.button is not None:
            # pull_up: the button shorts the pin to ground, the usual wiring on Pi HATs.
            self._button = Button(config.button, pull_up=True, hold_time=config.long_press_seconds)
            self._button.when_pressed = self._pressed
            self._button.when_held = self._long_press
            self._button.when_released = self._released
        if self._power is not None:
            self._blink(self._power, SLOW_BLINK)

    def _blink(self, led: LED, times: tuple[float, float]) -> None:
        self._stop_blinking(led)
        self._blinks[led] = Blink(led, *times, self.runtime)

    def _steady(self, led: LED, on: bool) -> None:
        self._stop_blinking(led)
        led.value = on

    def _stop_blinking(self, led: LED) -> None:
        blink = self._blinks.pop(led, None)
        if blink is not None:
            blink.stop()

    def show_ready(self) -> None:
        if self._power is not None:
            self._steady(self._power, True)

    def show_uplink(self, up: bool) -> None:
        if self._uplink is not None:
            self._uplink.value = up

    def show_backlog(self, queued: int) -> None:
        """Called on every queue change; only a change of level touches the pin, so blinks stay even."""
        level = backlog_level(queued, self._config.backlog_slow_from, self._config.backlog_fast_from)
        if self._backlog is None or level is self._backlog_shown:
            return
        self._backlog_shown = level
        if level is BacklogLevel.EMPTY:
            self._steady(self._backlog, False)
        else:
            self._blink(self._backlog, SLOW_BLINK if level is BacklogLevel.BACKLOG else FAST_BLINK)

    def _pressed(self) -> None:
        self._held = False

    def _long_press(self) -> None:
        self._held = True
        self._on_long_press()

    def _released(self) -> None:
        if not self._held:
            self._on_short_press()

    def close(self) -> None:
        for blink in self._blinks.values():
            blink.stop()
        self._blinks.clear()
        for device in (self._power, self._uplink, self._backlog, self._button, self.relay):
            if device is not None:
                device.close()
