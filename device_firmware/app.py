"""Boot: read the config, bring the board up, start the thermostat. Boards run it from `main.py`.

A file named SAFE_BOOT on the flash stops here, before the hardware watchdog is armed (it cannot
be disarmed once started): deploy.py creates it, resets the board and copies the new files at
leisure, then removes it and resets again. Hold-off by file, not by pin, so it needs no wiring.

The order is for the heap: the config is read first by a module that is unloaded at once, so the
hole its bytecode leaves sits at the bottom of the heap, where the small objects made afterwards
fill it, not between the thermostat's code and its buffers.
"""

import gc
import os
import sys


def _start() -> None:
    # In a function: its names are locals, where at module level each would be a qstr for good.
    import config

    settings = config.load_config("config.json")
    del sys.modules["config"], config
    gc.collect()

    import board  # (after the config is unloaded: see the module docstring)

    sensor, relay, watchdog, led, restart = board.make_board(settings["hardware"])
    del sys.modules["board"], board
    import thermostat

    link = None
    wifi_config = settings["wifi"]
    if wifi_config["ssid"]:  # boards; the unix port has no radio and no network module
        import network
        import wifi
        link = wifi.Station(network, wifi_config["ssid"], wifi_config["password"],
                            wifi_config["backoff_min_ms"], wifi_config["backoff_max_ms"])
    print("thermostat", settings["thermostat"], "starting")
    app = thermostat.Thermostat(settings, sensor, relay, watchdog, restart, led, link)
    del settings, wifi_config
    app.run()


try:
    os.stat("SAFE_BOOT")
    print("safe boot: SAFE_BOOT present, thermostat not started")
except OSError:
    _start()
