"""Over-the-air updates, the door: `start(thermostat)` is the updater if the heap has room for it.

The thermostat imports this module only when its desired version differs from its own. The updater
(`ota_fetch.py`) needs about 7 KB for its code and, since its names take MicroPython past 300 qstrs,
a new qstr pool of 3.5 KB in one piece. Imported where that does not fit, it would fail half way and
leave its names behind, making the heap worse for good; so this small module looks first, and
otherwise stands in for the updater, saying in telemetry what is missing. On the unix port's 64 KB heap
(16.5 KB free after registration) that is what happens: see docs/firmware.md, OTA, Heap.
"""

import gc
import sys
from micropython import const

_NEEDS = const(24576)  # free heap (after a collection) an update needs to start, measured with room to spare


class NoRoom:
    """The updater's stand-in when the heap is too small: same calls, reports why nothing happens."""

    def __init__(self, app, free):
        self.app = app
        self.version = None
        self.reason = "needs %d B of free heap, has %d" % (_NEEDS, free)
        print("update:", self.reason)

    def offer(self, raw) -> bool:
        if raw is None:
            print("update: none wanted now")
            del sys.modules["ota"]
            return False
        self.version = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")[:32]
        return True

    def poll(self) -> None:
        pass

    def status(self) -> dict:
        return {"state": "no_memory", "version": self.version, "file": None, "offset": None, "reason": self.reason}


def start(app):
    """The updater of the thermostat `app`, or its stand-in (named `start`: a word MicroPython holds)."""
    gc.collect()
    free = gc.mem_free()
    if free < _NEEDS:
        return NoRoom(app, free)
    import ota_fetch
    return ota_fetch.Updater(app)
