"""Boot: read the config, bring the board up, start the thermostat. Boards run it from `main.py`.

The order is for the heap: the config is read first by a module that is unloaded at once, so the
hole its bytecode leaves sits at the bottom of the heap, where the small objects made afterwards
fill it, not between the thermostat's code and its buffers.
"""

import gc
import sys

import config

settings = config.load_config("config.json")
del sys.modules["config"], config
gc.collect()

import board  # noqa: E402  (after the config is unloaded: see the module docstring)
import thermostat  # noqa: E402

sensor, relay, watchdog = board.make_board(settings["hardware"])
print("thermostat", settings["thermostat"], "starting")
app = thermostat.Thermostat(settings, sensor, relay, watchdog, board.restart)
del settings
app.run()
