"""The thermostat's hardware: temperature sensor, heater relay, watchdog, restart.

The application only calls `sensor.read()` (degrees C, OSError when the sensor fails),
`relay.value(on)` and `watchdog.feed()`, so the same code runs on a board (`board_pins`:
machine.ADC, machine.Pin, machine.WDT) and on the unix port (`board_sim`: a simulated room).
Only the module the config asks for is imported: the other one would be heap spent for nothing.
"""


class NoWatchdog:
    """The unix port has no hardware watchdog; feeding it does nothing."""

    def feed(self) -> None:
        pass


def restart() -> None:
    """A clean reboot after too many faults: machine.reset() on boards; on unix, exit with status 3
    (there a supervisor, or the test, decides what comes next)."""
    try:
        import machine
        machine.reset()
    except (ImportError, AttributeError):
        raise SystemExit(3)


def make_board(hardware: dict):
    """(sensor, relay, watchdog, status LED or None) from the config's `hardware` section."""
    kind = hardware.get("kind", "simulated")
    if kind == "simulated":
        import board_sim
        relay = board_sim.SimulatedRelay()
        return board_sim.SimulatedRoom(relay, **hardware.get("room", {})), relay, NoWatchdog(), None
    if kind != "board":
        raise ValueError("config: hardware.kind must be 'simulated' or 'board', not %r" % kind)
    import board_pins
    return board_pins.make_board(hardware)
