"""The unix port's stand-in hardware: a simulated room and a relay that prints its switches.

The room's temperature follows the heater through a first-order thermal model; the relay prints
every switch on stdout (the unix port has no pins; the print is what tests watch). A module of its
own so a board never loads it, and the unix port never loads the pin drivers (`board_pins`).
"""

import os
import time


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


class NoWatchdog:
    """The unix port has no hardware watchdog; feeding it does nothing."""

    def feed(self) -> None:
        pass


def restart() -> None:
    """After too many faults: the unix port has no reset, so exit with status 3 (a supervisor, or
    the test, decides what comes next)."""
    raise SystemExit(3)


def make_board(hardware: dict):
    """(sensor, relay, watchdog, status LED, restart): the room of `hardware.room`, no LED."""
    relay = SimulatedRelay()
    return SimulatedRoom(relay, **hardware.get("room", {})), relay, NoWatchdog(), None, restart


class SimulatedRoom:
    """dT/dt = heat_c_per_s * heater - loss_per_s * (T - ambient), integrated at every read.

    `fault_file`: while that file exists the sensor fails, to exercise sensor-failure alerts."""

    def __init__(self, relay, start_c=18.0, ambient_c=10.0, heat_c_per_s=0.05,
                 loss_per_s=0.002, fault_file=None):
        self.relay = relay
        self.temp = start_c
        # Attributes named as the config's keys: on a 64 KB heap every distinct name is a qstr.
        self.ambient_c = ambient_c
        self.heat_c_per_s = heat_c_per_s
        self.loss_per_s = loss_per_s
        self.fault_file = fault_file
        self.last = time.ticks_ms()

    def read(self) -> float:
        now = time.ticks_ms()
        dt = time.ticks_diff(now, self.last) / 1000
        self.last = now
        self.temp += dt * (self.heat_c_per_s * self.relay.value() - self.loss_per_s * (self.temp - self.ambient_c))
        if self.fault_file:
            try:
                os.stat(self.fault_file)
            except OSError:
                return self.temp
            raise OSError("simulated sensor fault")
        return self.temp
