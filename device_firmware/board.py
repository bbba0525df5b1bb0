"""The thermostat's hardware: temperature sensor, heater relay, watchdog.

The application only calls `sensor.read()` (degrees C, OSError when the sensor fails),
`relay.value(on)` and `watchdog.feed()`, so the same code runs on a board (machine.ADC,
machine.Pin, machine.WDT) and on the unix port, where a simulated room stands in: its temperature
follows the heater through a first-order thermal model, and its relay prints every switch on
stdout (the unix port has no pins; the print is what tests watch).
"""

import os
import time


def _exists(path: str) -> bool:
    try:
        os.stat(path)
        return True
    except OSError:
        return False


class SimulatedRelay:
    def __init__(self):
        self.on = False

    def value(self, on=None):
        if on is None:
            return int(self.on)
        on = bool(on)
        if on != self.on:
            self.on = on
            print("relay", "on" if on else "off")
        return None


class SimulatedRoom:
    """dT/dt = heat_c_per_s * heater - loss_per_s * (T - ambient), integrated at every read.

    `fault_file`: while that file exists the sensor fails, to exercise sensor-failure alerts."""

    def __init__(self, relay, start_c=18.0, ambient_c=10.0, heat_c_per_s=0.05,
                 loss_per_s=0.002, fault_file=None):
        self.relay = relay
        self.temp = start_c
        self.ambient = ambient_c
        self.heat = heat_c_per_s
        self.loss = loss_per_s
        self.fault_file = fault_file
        self.last = time.ticks_ms()

    def read(self) -> float:
        now = time.ticks_ms()
        dt = time.ticks_diff(now, self.last) / 1000
        self.last = now
        self.temp += dt * (self.heat * self.relay.value() - self.loss * (self.temp - self.ambient))
        if self.fault_file and _exists(self.fault_file):
            raise OSError("simulated sensor fault")
        return self.temp


class TMP36Sensor:
    """An analog TMP36 on an ADC pin: 10 mV per degree, 500 mV at 0 C."""

    def __init__(self, pin: int, vref: float = 3.3):
        import machine
        self.adc = machine.ADC(machine.Pin(pin))
        self.vref = vref

    def read(self) -> float:
        raw = self.adc.read_u16()
        if raw in (0, 65535):  # rail readings: open or shorted sensor
            raise OSError("sensor reading at rail")
        return (raw * self.vref / 65535 - 0.5) * 100


class NoWatchdog:
    """The unix port has no hardware watchdog; feeding it does nothing."""

    def feed(self) -> None:
        pass


def make_board(hardware: dict):
    """(sensor, relay, watchdog) from the config's `hardware` section."""
    kind = hardware.get("kind", "simulated")
    if kind == "simulated":
        relay = SimulatedRelay()
        room = hardware.get("room", {})
        return SimulatedRoom(relay, **room), relay, NoWatchdog()
    if kind != "board":
        raise ValueError("config: hardware.kind must be 'simulated' or 'board', not %r" % kind)
    import machine
    relay = machine.Pin(hardware["relay_pin"], machine.Pin.OUT, value=0)
    sensor = TMP36Sensor(hardware["sensor_pin"])
    watchdog = machine.WDT(timeout=hardware.get("watchdog_ms", 30000))
    return sensor, relay, watchdog
