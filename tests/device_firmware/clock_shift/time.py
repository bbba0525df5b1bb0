# Test-only stand-in for a board whose RTC is wrong: the built-in `time` module, with time_ns()
# (what device_firmware/hlc.py reads the wall clock from) shifted by $CLOCK_SHIFT_S seconds.
# MicroPython lets a .py on the path extend a built-in module; tests put this directory first on
# MICROPYPATH. The firmware is not changed: it sees a clock hours off, as on a misdeployed board.
import os
import sys

_path = sys.path[:]
sys.path.clear()
try:
    from time import *  # noqa: F403 - the built-in one, now that nothing on the path shadows it
    from time import time_ns as _real_time_ns
finally:
    sys.path.extend(_path)

_SHIFT_NS = int(os.getenv("CLOCK_SHIFT_S") or "0") * 1000000000


def time_ns():
    return _real_time_ns() + _SHIFT_NS
