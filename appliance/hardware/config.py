"""Schema of the ``[hardware]`` section. Everything is off by default: most machines have no GPIO or modem.

Two independent tables, each with its own ``enabled`` switch, because a gateway may have status LEDs but a
wired uplink (no modem), or a USB modem on a board without GPIO. Pins are BCM numbers; a pin left out means
"not fitted", so a board with only a relay and a button is a valid configuration. The pin library is picked
by gpiozero itself (``GPIOZERO_PIN_FACTORY`` overrides it), so the schema holds no driver name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.config.errors import ConfigError
from appliance.config.fields import (
    get_bool,
    get_float,
    get_int,
    get_str,
    join,
    reject_unknown,
    require_table,
)

GPIO_PINS = ("power_led", "uplink_led", "backlog_led", "button", "modem_relay")
HIGHEST_BCM_PIN = 27


@dataclass(frozen=True, slots=True)
class GpioConfig:
    enabled: bool = False
    power_led: int | None = None
    uplink_led: int | None = None
    backlog_led: int | None = None
    button: int | None = None
    modem_relay: int | None = None
    #: True when driving the relay pin high powers the modem (normally-open contact on an active-high board).
    relay_active_high: bool = True
    long_press_seconds: float = 10.0
    #: Queued messages from which the backlog LED blinks slowly, and from which it blinks fast.
    backlog_slow_from: int = 1
    backlog_fast_from: int = 1000


@dataclass(frozen=True, slots=True)
class ModemConfig:
    enabled: bool = False
    port: str = "/dev/ttyUSB2"
    baudrate: int = 115200
    #: How long one AT command may take before the modem counts as not answering.
    command_timeout: float = 5.0
    poll_interval: float = 30.0
    #: How long the relay keeps the modem unpowered during a power cycle.
    power_off_seconds: float = 3.0
    #: After a power cycle, how long to wait for ``RDY`` and a network registration.
    ready_timeout: float = 90.0
    backoff_initial: float = 30.0
    backoff_max: float = 900.0


@dataclass(frozen=True, slots=True)
class HardwareConfig:
    gpio: GpioConfig = field(default_factory=GpioConfig)
    modem: ModemConfig = field(default_factory=ModemConfig)

    @property
    def enabled(self) -> bool:
        return self.gpio.enabled or self.modem.enabled


def _optional_pin(raw: Mapping[str, Any], key: str, path: str) -> int | None:
    if key not in raw:
        return None
    return get_int(raw, key, path, minimum=0, maximum=HIGHEST_BCM_PIN)


def parse_gpio(raw: Mapping[str, Any], path: str) -> GpioConfig:
    reject_unknown(
        raw,
        path,
        (
            "enabled",
            *GPIO_PINS,
            "relay_active_high",
            "long_press_seconds",
            "backlog_slow_from",
            "backlog_fast_from",
        ),
    )
    defaults = GpioConfig()
    pins = {key: _optional_pin(raw, key, path) for key in GPIO_PINS}
    seen: dict[int, str] = {}
    for key, pin in pins.items():
        if pin is None:
            continue
        if pin in seen:
            raise ConfigError(join(path, key), f"pin {pin} is already used by {join(path, seen[pin])}")
        seen[pin] = key
    slow = get_int(raw, "backlog_slow_from", path, defaults.backlog_slow_from, minimum=1)
    fast = get_int(raw, "backlog_fast_from", path, defaults.backlog_fast_from, minimum=1)
    if fast < slow:
        raise ConfigError(join(path, "backlog_fast_from"), f"must be >= backlog_slow_from ({slow}), got {fast}")
    long_press = get_float(raw, "long_press_seconds", path, defaults.long_press_seconds, minimum=0.05)
    return GpioConfig(
        enabled=get_bool(raw, "enabled", path, False),
        relay_active_high=get_bool(raw, "relay_active_high", path, True),
        long_press_seconds=long_press,
        backlog_slow_from=slow,
        backlog_fast_from=fast,
        **pins,
    )


def parse_modem(raw: Mapping[str, Any], path: str) -> ModemConfig:
    keys = (
        "enabled",
        "port",
        "baudrate",
        "command_timeout",
        "poll_interval",
        "power_off_seconds",
        "ready_timeout",
        "backoff_initial",
        "backoff_max",
    )
    reject_unknown(raw, path, keys)
    defaults = ModemConfig()
    backoff_initial = get_float(raw, "backoff_initial", path, defaults.backoff_initial, minimum=0.01)
    backoff_max = get_float(raw, "backoff_max", path, defaults.backoff_max, minimum=0.01)
    if backoff_max < backoff_initial:
        raise ConfigError(join(path, "backoff_max"), f"must be >= backoff_initial ({backoff_initial}), got {backoff_max}")
    port = get_str(raw, "port", path, defaults.port)
    if not port:
        raise ConfigError(join(path, "port"), "must name a serial device, got an empty string")
    return ModemConfig(
        enabled=get_bool(raw, "enabled", path, False),
        port=port,
        baudrate=get_int(raw, "baudrate", path, defaults.baudrate, minimum=300, maximum=4_000_000),
        command_timeout=get_float(raw, "command_timeout", path, defaults.command_timeout, minimum=0.01),
        poll_interval=get_float(raw, "poll_interval", path, defaults.poll_interval, minimum=0.01),
        power_off_seconds=get_float(raw, "power_off_seconds", path, defaults.power_off_seconds, minimum=0.0),
        ready_timeout=get_float(raw, "ready_timeout", path, defaults.ready_timeout, minimum=0.01),
        backoff_initial=backoff_initial,
        backoff_max=backoff_max,
    )


def parse(raw: Mapping[str, Any], path: str) -> HardwareConfig:
    reject_unknown(raw, path, ("gpio", "modem"))
    gpio = parse_gpio(require_table(raw.get("gpio", {}), join(path, "gpio")), join(path, "gpio"))
    modem = parse_modem(require_table(raw.get("modem", {}), join(path, "modem")), join(path, "modem"))
    return HardwareConfig(gpio=gpio, modem=modem)
