"""The [hardware] schema: off by default, and every error names the field path."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.config import ConfigError
from appliance.gateway_config import load_config


def hardware(section: dict[str, Any]):
    return load_config(None, {"hardware": section}).hardware


def test_everything_is_off_by_default() -> None:
    config = load_config().hardware
    assert not config.enabled and not config.gpio.enabled and not config.modem.enabled
    assert config.gpio.button is None and config.gpio.long_press_seconds == 10.0


def test_a_full_section_parses() -> None:
    config = hardware(
        {
            "gpio": {"enabled": True, "power_led": 17, "uplink_led": 27, "backlog_led": 22, "button": 23,
                     "modem_relay": 24, "relay_active_high": False, "long_press_seconds": 5},
            "modem": {"enabled": True, "port": "/dev/ttyACM0", "baudrate": 9600, "backoff_initial": 1, "backoff_max": 2},
        }
    )
    assert config.enabled and config.gpio.modem_relay == 24 and not config.gpio.relay_active_high
    assert config.modem.port == "/dev/ttyACM0" and config.modem.backoff_max == 2.0


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        ({"gpio": {"button": 40}}, "hardware.gpio.button", "<= 27"),
        ({"gpio": {"button": "GPIO4"}}, "hardware.gpio.button", "integer"),
        ({"gpio": {"button": 4, "uplink_led": 4}}, "hardware.gpio.button", "already used by hardware.gpio.uplink_led"),
        ({"gpio": {"backlog_slow_from": 10, "backlog_fast_from": 5}}, "hardware.gpio.backlog_fast_from", ">= backlog_slow_from"),
        ({"gpio": {"long_press_seconds": 0}}, "hardware.gpio.long_press_seconds", ">="),
        ({"gpio": {"led": 3}}, "hardware.gpio.led", "unknown setting"),
        ({"modem": {"port": ""}}, "hardware.modem.port", "empty"),
        ({"modem": {"backoff_initial": 10, "backoff_max": 1}}, "hardware.modem.backoff_max", ">= backoff_initial"),
        ({"modem": []}, "hardware.modem", "expected a table"),
        ({"enabled": True}, "hardware.enabled", "unknown setting"),
    ],
)
def test_errors_name_the_field(section: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        hardware(section)
    assert caught.value.path == path
    assert message in caught.value.message
