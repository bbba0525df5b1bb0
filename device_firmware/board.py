"""Picks the thermostat's hardware from the config: pins on a board, a simulated room on unix.

The application only calls `sensor.read()` (degrees C, OSError when the sensor fails),
`relay.value(on)`, `led.value(on)`, `watchdog.feed()` and `restart()`, so the same code runs on a
board (`board_pins`: machine.ADC, machine.Pin, machine.WDT, machine.reset) and on the unix port
(`board_sim`). Only the module the config asks for is imported, and this one is unloaded after
boot (app.py): on a 64 KB heap, code that has done its job is worth giving back.
"""


def make_board(hardware: dict):
    """(sensor, relay, watchdog, status LED or None, restart) from the config's `hardware` section."""
    kind = hardware.get("kind", "simulated")
    if kind == "simulated":
        import board_sim
        return board_sim.make_board(hardware)
    if kind != "board":
        raise ValueError("config: hardware.kind must be 'simulated' or 'board', not %r" % kind)
    import board_pins
    return board_pins.make_board(hardware)
