"""Pin drivers for real boards (ESP32, Raspberry Pi Pico W): sensor, relay, status LED, watchdog.

Imported only when the config's `hardware.kind` is `"board"`; the wiring table is in
docs/firmware.md. The thermostat calls `sensor.read()`, `relay.value(on)`, `led.value(on)` and
`watchdog.feed()`, the same calls it makes on the unix port's simulated room.
"""

import machine


class TMP36Sensor:
    """An analog TMP36 on an ADC pin: 10 mV per degree, 500 mV at 0 C (0.1-1.75 V for -40..125 C)."""

    def __init__(self, pin: int, vref: float = 3.3):
        self.adc = machine.ADC(machine.Pin(pin))
        if hasattr(self.adc, "atten"):  # ESP32: without 11 dB attenuation the ADC tops out near 1 V
            self.adc.atten(machine.ADC.ATTN_11DB)
        self.vref = vref

    def read(self) -> float:
        raw = self.adc.read_u16()
        if raw in (0, 65535):  # rail readings: open or shorted sensor
            raise OSError("sensor reading at rail")
        return (raw * self.vref / 65535 - 0.5) * 100


class Output:
    """A relay or LED on a GPIO; `active_low` for boards that switch to ground (many relay modules)."""

    def __init__(self, pin, active_low: bool = False):
        self.active_low = active_low
        self.pin = machine.Pin(pin, machine.Pin.OUT, value=1 if active_low else 0)

    def value(self, on=None):
        if on is None:
            return self.pin.value() ^ self.active_low
        self.pin.value(bool(on) ^ self.active_low)
        return None


def restart() -> None:
    """A clean reboot after too many faults."""
    machine.reset()


def make_board(hardware: dict):
    """(sensor, relay, watchdog, status LED or None, restart) on the pins the config names. The
    watchdog is armed last: once armed it cannot be stopped, so nothing slow may come after it."""
    relay = Output(hardware["relay_pin"], hardware.get("relay_active_low", False))
    sensor = TMP36Sensor(hardware["sensor_pin"])
    led_pin = hardware.get("led_pin")
    led = Output(led_pin) if led_pin is not None else None
    watchdog = machine.WDT(timeout=hardware.get("watchdog_ms", 30000))
    return sensor, relay, watchdog, led, restart
