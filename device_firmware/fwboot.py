"""Which firmware version boots, and the rollback of one that does not come up. Run by `main.py`
before the application is imported, and never replaced by an update (the copy in the flash's root
is the one that runs), so a broken update cannot break the way back. The deployed `main.py` only
imports the app; the first update replaces it with the form that runs this (`ota_updater.MAIN_PY`), so a
board that was never updated spends no heap on it.

The deployed version lives in the flash's root; each over-the-air update is written beside it in
`firmware/<version>/` (by `ota.py`). The pointer `firmware.txt` says which one boots, as one line
`<version> <previous> <boots> <failed>` ("-" for none): the version to boot (none: the root), the one
to go back to (none: the root), how many times the version on trial has started (none: it is not on
trial), the last version rolled back. It is only ever replaced whole (`firmware.new` renamed over it),
so a power cut leaves the old pointer or the new one.

A version is on trial from the update's switch (boots 0) until the application `accept()`s it, at its
first telemetry as a registered thermostat. Each boot on trial counts one; one found still on trial
at boot never got that far (it crashed, hung until the watchdog reset the board, or lost power): the
pointer goes back to the previous version and names the failed one, so the thermostat does not fetch
it again. An exception out of a version on trial (`reset(e)`) rolls it back at once and resets. A
rollback is also written to the update record `update.json` (`rolled_back`, the version, why), which
the thermostat reports and heeds (ota.py); an accepted version removes the record: the update is over.

Heap: every name here is a qstr for the whole run, so the functions are few and named with words
MicroPython already knows (read, write, start, reset, accept; `back` is the one more), and temporary
file names are over 10 characters (strings, not qstrs). The module is not kept loaded, not even on
trial: main.py leaves None under its name in sys.modules as the app's sign that the version is on
trial, and the app imports it again to `accept()`. Going back to the deployed version also puts back
its plain main.py, so that board boots as one never updated, without this module's names.
"""

import json
import os
import sys
from micropython import const

_MAX_TRIAL_BOOTS = const(1)  # starts a version on trial may make without accepting before it is rolled back


def read() -> list:
    """[version, previous, boots, failed]: names or None, boots an int or None."""
    try:  # it exists: main.py runs fwboot only once an update wrote both
        with open("firmware.txt") as f:
            fields = f.read().split()
    except OSError:
        fields = ()
    if len(fields) != 4:
        return [None, None, None, None]
    value = [None if v == "-" else v for v in fields]
    value[2] = int(value[2]) if value[2] and value[2].isdigit() else None
    return value


def write(value) -> None:
    """Replace the pointer whole: a new file renamed over the old one."""
    with open("firmware.new", "w") as f:
        f.write(" ".join("-" if v is None else str(v) for v in value))
    os.rename("firmware.new", "firmware.txt")


def back(value, reason) -> list:
    """Roll the pointer `value` back from its version on trial; the update record says why."""
    print("firmware %s rolled back: %s" % (value[0], reason))
    with open("update.json.new", "w") as f:
        json.dump({"state": "rolled_back", "version": value[0], "reason": reason}, f)
    os.rename("update.json.new", "update.json")
    value = [value[1], None, None, value[0]]
    write(value)
    if value[0] is None:  # back to the deployed version: its own main.py, which never loads this module
        with open("main.py.new", "w") as f:  # (heap: this module's names and main.py's would stay interned)
            f.write("import app\n")
        os.rename("main.py.new", "main.py")
    return value


def start() -> bool:
    """Put the version to boot first on sys.path; True if it is on trial."""
    value = read()
    if value[2] is not None:
        if value[2] >= _MAX_TRIAL_BOOTS:
            value = back(value, "no telemetry after %d boot(s)" % value[2])
        else:
            value[2] += 1
            write(value)
    if value[0]:
        try:
            os.stat("firmware/%s" % value[0])
            sys.path.insert(0, "firmware/%s" % value[0])
        except OSError:
            print("firmware %s is missing, booting the deployed version" % value[0])
    return value[2] is not None


def reset(e) -> None:
    """The application raised e: a version on trial is rolled back and the board reset; otherwise e
    goes on (as before updates existed)."""
    value = read()
    if value[2] is None:
        raise e
    sys.print_exception(e)
    back(value, "%s: %s" % (type(e).__name__, e))
    try:
        import machine
        machine.reset()
    except (ImportError, AttributeError):  # the unix port: exit; whoever runs it starts it again
        pass
    raise SystemExit(3)


def accept() -> None:
    """The version on trial reached its first telemetry: it stays (the app calls this once, after
    importing this module again in place of main.py's mark). This module is unloaded: nothing more
    to do until the next boot."""
    del sys.modules["fwboot"]
    value = read()
    if value[2] is not None:
        value[2] = None
        write(value)
        try:
            os.remove("update.json")
        except OSError:
            pass
        print("firmware %s accepted" % (value[0] or "(deployed)"))
