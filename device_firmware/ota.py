"""Over-the-air updates, the door: `start(thermostat)` is the updater if the heap has room for it.

The thermostat imports this module only when its desired version differs from its own. The updater
(`ota_fetch.py`) needs about 7 KB for its code and, since its names take MicroPython past 300 qstrs,
a new qstr pool of 3.5 KB in one piece. Imported where that does not fit, it would fail half way and
leave its names behind, making the heap worse for good; so this small module looks first, and
otherwise stands in for the updater, saying in telemetry what is missing. On the unix port's 64 KB heap
(16.3 KB free after registration) that is what happens: see docs/firmware.md, OTA, Heap.

The door's own names must not cross that line either: they stay interned after it unloads, and the
running thermostat holds 292 of the 300 qstrs four pools take, so the door may add 8 at most (a ninth
allocates the fifth pool, 3.6 KB in the middle of the heap, for good: its largest free block fell from
4.2 KB to 0.9 KB). It adds 5: its file name, `ota_fetch`, `Updater`, `no_memory`, `offset`. Hence the
stand-in's name (`Updater`, which the import of the real one needs anyway), no argument name of its
own, and each line printed as one string (a literal of up to 10 characters is a qstr).
"""

import gc
import sys
from micropython import const

_NEEDS = const(24576)  # free heap (after a collection) an update needs to start, measured with room to spare


class Updater:
    """The updater's stand-in when the heap is too small: same calls, reports why nothing happens.
    Named as the real one (`ota_fetch.Updater`) for the qstr it shares: see the module docstring."""

    def __init__(self, app, reason):
        self.app = app
        self.version = None
        self.reason = reason

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
        line = "update: needs %d B of free heap, has %d" % (_NEEDS, free)
        print(line)
        return Updater(app, line[8:])  # telemetry's reason: the line without its "update: "
    import ota_fetch
    return ota_fetch.Updater(app)
