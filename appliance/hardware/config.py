"""Schema of the ``[hardware]`` section. Everything is off by default: most machines have no GPIO or modem.

Two independent tables, each with its own ``enabled`` switch, because a gateway may have status LEDs but a
wired uplink (no modem), or a USB modem on a board without GPIO. Pins are BCM numbers; a pin left out means
"not fitted", so a board with only a relay and a button is a valid configuration. The pin library is picked
by gpiozero itself (``GPIOZERO_PIN_FACTORY`` overrides it), so the schema holds no driver name. Each
setting is written once, as a field (``appliance.config.schema``); reference: docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from appliance.config.errors import ConfigError
from appliance.config.schema import join, setting

GPIO_PINS = ("power_led", "uplink_led", "backlog_led", "button", "modem_relay")
HIGHEST_BCM_PIN = 27


def _pin(doc: str) -> Any:
    return setting(None, minimum=0, maximum=HIGHEST_BCM_PIN, doc=f"BCM pin: {doc}; absent: not fitted")


@dataclass(frozen=True, slots=True)
class GpioConfig:
    enabled: bool = setting(False, doc="drive the LEDs, button and relay below (gpiozero)")
    power_led: int | None = _pin("slow blink while starting, steady once ready")
    uplink_led: int | None = _pin("on while the upstream (or, without one, the modem) is connected")
    backlog_led: int | None = _pin("blinks while messages are queued")
    button: int | None = _pin("to ground; short press logs status, long press = factory reset")
    modem_relay: int | None = _pin("the modem's supply; energised = powered")
    relay_active_high: bool = setting(True, doc="driving the relay pin high powers the modem")
    long_press_seconds: float = setting(10.0, minimum=0.05, doc="a press this long is a factory reset")
    backlog_slow_from: int = setting(1, minimum=1, doc="queued messages from which the backlog LED blinks slowly")
    backlog_fast_from: int = setting(1000, minimum=1, doc="queued messages from which it blinks fast; >= backlog_slow_from")

    def checked(self, given: Mapping[str, Any], path: str) -> GpioConfig:
        seen: dict[int, str] = {}
        for key in GPIO_PINS:
            pin = getattr(self, key)
            if pin in seen:
                raise ConfigError(join(path, key), f"pin {pin} is already used by {join(path, seen[pin])}")
            if pin is not None:
                seen[pin] = key
        if self.backlog_fast_from < self.backlog_slow_from:
            raise ConfigError(
                join(path, "backlog_fast_from"),
                f"must be >= backlog_slow_from ({self.backlog_slow_from}), got {self.backlog_fast_from}",
            )
        return self


@dataclass(frozen=True, slots=True)
class ModemConfig:
    enabled: bool = setting(False, doc="watch the cellular modem over AT commands (pyserial)")
    port: str = setting("/dev/ttyUSB2", doc="the modem's AT serial device")
    baudrate: int = setting(115200, minimum=300, maximum=4_000_000, doc="the AT port's speed")
    command_timeout: float = setting(5.0, minimum=0.01, doc="no final result within this: the modem is not answering")
    poll_interval: float = setting(30.0, minimum=0.01, doc="AT+CSQ, AT+CREG?, AT+CEREG?, AT+COPS?")
    power_off_seconds: float = setting(3.0, minimum=0.0, doc="how long the relay keeps the modem unpowered in a power cycle")
    ready_timeout: float = setting(90.0, minimum=0.01, doc="after a power cycle: wait this long for RDY and a registration")
    backoff_initial: float = setting(30.0, minimum=0.01, doc="then wait, doubling up to backoff_max, before the next cycle")
    backoff_max: float = setting(900.0, minimum=0.01, doc=">= backoff_initial")

    def checked(self, given: Mapping[str, Any], path: str) -> ModemConfig:
        if self.backoff_max < self.backoff_initial:
            raise ConfigError(
                join(path, "backoff_max"), f"must be >= backoff_initial ({self.backoff_initial}), got {self.backoff_max}"
            )
        if not self.port:
            raise ConfigError(join(path, "port"), "must name a serial device, got an empty string")
        return self


@dataclass(frozen=True, slots=True)
class HardwareConfig:
    gpio: GpioConfig = setting(factory=GpioConfig)
    modem: ModemConfig = setting(factory=ModemConfig)

    @property
    def enabled(self) -> bool:
        return self.gpio.enabled or self.modem.enabled
