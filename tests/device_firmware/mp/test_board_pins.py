# device_firmware/board_pins.py under MicroPython with a stand-in `machine` module (the unix port
# has no pins): the relay/LED polarity, the TMP36 conversion and its rail check, what is armed last.
import sys

from check import eq, raises

armed = []


class Pin:
    OUT = 1

    def __init__(self, pin, mode=None, value=None):
        self.pin = pin
        self.level = value

    def value(self, level=None):
        if level is None:
            return self.level
        self.level = int(level)


class ADC:
    ATTN_11DB = 3

    def __init__(self, pin):
        self.raw = 0
        self.attenuation = None

    def atten(self, attenuation):
        self.attenuation = attenuation

    def read_u16(self):
        return self.raw


class WDT:
    def __init__(self, timeout):
        armed.append(timeout)


class FakeMachine:
    Pin = Pin
    ADC = ADC
    WDT = WDT


sys.modules["machine"] = FakeMachine
import board_pins  # noqa: E402  (after the stand-in is in place)


def test_active_low_relay_is_off_at_start_and_inverted():
    relay = board_pins.Output(15, active_low=True)
    eq((relay.pin.level, relay.value()), (1, 0))
    relay.value(True)
    eq((relay.pin.level, relay.value()), (0, 1))
    led = board_pins.Output(2)
    led.value(1)
    eq(led.pin.level, 1)


def test_tmp36_conversion_attenuation_and_rail_failures():
    sensor = board_pins.TMP36Sensor(34)
    eq(sensor.adc.attenuation, ADC.ATTN_11DB)
    sensor.adc.raw = int(0.75 / 3.3 * 65535)  # 750 mV = 25 C
    eq(round(sensor.read(), 1), 25.0)
    for rail in (0, 65535):
        sensor.adc.raw = rail
        raises(OSError, sensor.read)


def test_make_board_arms_the_watchdog_with_the_configured_timeout():
    sensor, relay, watchdog, led, restart = board_pins.make_board(
        {"sensor_pin": 26, "relay_pin": 15, "relay_active_low": True, "led_pin": "LED", "watchdog_ms": 8000})
    eq((armed[-1], led.pin.pin, relay.value(), restart), (8000, "LED", 0, board_pins.restart))
    eq(board_pins.make_board({"sensor_pin": 26, "relay_pin": 15})[3], None)
