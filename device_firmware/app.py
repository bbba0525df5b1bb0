"""Boot: read the config, bring the board up, start the thermostat. Boards run it from `main.py`.

A file named SAFE_BOOT on the flash stops here, before the hardware watchdog is armed (it cannot
be disarmed once started): deploy.py creates it, resets the board and copies the new files at
leisure, then removes it and resets again. Hold-off by file, not by pin, so it needs no wiring.

The order is for the heap: the config is read first by a module that is unloaded at once, so the
hole its bytecode leaves sits at the bottom of the heap, where the small objects made afterwards
fill it, not between the thermostat's code and its buffers.

An over-the-air update is installed by a boot of its own: when the request `update.pending` exists
(written by the thermostat, ota.py), the updater (`ota_updater.start`) runs instead of the
thermostat, on the same config, board and Wi-Fi, with the rest of the heap to itself; it resets the
board when it is done (docs/firmware.md, "Over-the-air updates"). It is imported by a name of over 10
characters given as a string, which MicroPython keeps as a string, not as one more qstr for good.
"""

import gc
import os
import sys


def _start() -> None:
    # In a function: its names are locals, where at module level each would be a qstr for good.
    try:
        os.stat("update.pending")
        updating = True
    except OSError:
        updating = False
    import config

    settings = config.load_config("config.json")
    del sys.modules["config"], config
    gc.collect()

    import board  # (after the config is unloaded: see the module docstring)

    sensor, relay, watchdog, led, restart = board.make_board(settings["hardware"])
    del sys.modules["board"], board
    if updating:  # same arguments as the thermostat; it never returns (it resets the board)
        program = __import__("ota_updater").start
    else:
        import thermostat
        program = thermostat.Thermostat

    link = None
    wifi_config = settings["wifi"]
    if wifi_config["ssid"]:  # boards; the unix port has no radio and no network module
        import network
        import wifi
        link = wifi.Station(network, wifi_config["ssid"], wifi_config["password"],
                            wifi_config["backoff_min_ms"], wifi_config["backoff_max_ms"])
    print("thermostat", settings["thermostat"], "starting")
    gc.collect()  # the imports' garbage first: the program's buffers then fill its holes, not the heap's top
    return program(settings, sensor, relay, watchdog, restart, led, link)


try:
    os.stat("SAFE_BOOT")
    print("safe boot: SAFE_BOOT present, thermostat not started")
except OSError:
    app = _start()
    del _start  # boot code: its bytecode is not kept for the run (350 B; docs/firmware.md, Memory)
    app.run()
