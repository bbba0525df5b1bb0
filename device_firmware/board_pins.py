"""Pin drivers for real boards (ESP32, Raspberry Pi Pico W): TMP36 sensor, relay, watchdog.

Imported only when the config's `hardware.kind` is `"board"`; see docs/firmware.md for wiring.
"""

import machine


class TMP36Sensor:
    """An analog TMP36 on an ADC pin: 10 mV per degree, 500 mV at 0 C."""

    def __init__(self, pin: int, vref: float = 3.3):
        self.adc = machine.ADC(machine.Pin(pin))
        self.vref = vref

    def read(self) -> float:
        raw = self.adc.read_u16()
        if raw in (0, 65535):  # rail readings: open or shorted sensor
            raise OSError("sensor reading at rail")
        return (raw * self.vref / 65535 - 0.5) * 100


def make_board(hardware: dict):
    """(sensor, relay, watchdog) on the pins the config names."""
    relay = machine.Pin(hardware["relay_pin"], machine.Pin.OUT, value=0)
    sensor = TMP36Sensor(hardware["sensor_pin"])
    watchdog = machine.WDT(timeout=hardware.get("watchdog_ms", 30000))
    return sensor, relay, watchdog
