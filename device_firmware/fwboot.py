"""Which firmware version boots, and the rollback of one that does not come up. Never replaced by an
update: the copy in the flash's root, deployed with the bundle, is the one that runs for the board's
life, so a broken update cannot break the way back, and the files it reads and writes (the pointer,
`main.py`, the update record) are a format every later version's updater must keep (docs/firmware.md,
"Over-the-air updates").

The deployed version lives in the flash's root; an over-the-air update is written beside it into a
directory the updater picks (ota_updater.py: `fw/a` or `fw/b`, whichever is not running; short,
because every module's `__file__` is interned with its whole path for the whole run). The pointer
`firmware.txt` says which one boots, as one line `<version> <previous> <boots> <failed> <dir>
<previous dir>` ("-" for none): the version to boot (none: the root), the one to go back to (none:
the root), 0 while the version is on trial (none: it is not), the last version rolled back, and the
directories of the first two. This module only moves the fields around, so the directories' names are
the updater's to choose (and none of them is a qstr here). Each file is only ever replaced whole (a
`.new` file renamed over it), so a power cut leaves the old one or the new one.

`main.py` is written here only (`write`), in the form the pointer needs, so that no boot of the
thermostat loads this module, whose code and names would stay in its heap:
- the deployed version: `import app` (as deploy.py writes it);
- an accepted update: its directory first on sys.path, then `import app`;
- the first boot of a version on trial: the same, after putting back `main.py.trial` (a line that runs
  `start()`) as `main.py`, and with None under this module's name in sys.modules, the app's sign that
  it is on trial. The app `accept()`s the version at its first telemetry as a registered thermostat,
  which writes the accepted form. A version whose app raises is rolled back at once (`reset(e)`);
  one that never got that far (it hung until the watchdog reset the board, or lost power) boots
  `start()` next, which rolls it back. Either resets the board into the previous version.
The pointer goes into a trial after `main.py.trial` and before `main.py`, and out of it before
`main.py`; a `start()` that finds the pointer not on trial (a power cut between the two files) writes
the `main.py` it needs. Each resets the board rather than boot the app in a heap this module has used.
A rollback names the failed version in the pointer, so the thermostat does not fetch it again, and
in the update record `update.json` (`rolled_back`, the version, why), which the thermostat reports
and heeds (ota.py); an accepted version removes the record: the update is over.

Heap: only the boots that run `start()` or `accept()` intern this module's names, so the functions are
few and named with words MicroPython already knows (read, write, start, reset, accept, replace; `back`
is the one more), and file names are over 10 characters (strings, not qstrs).
"""

import json
import os
import sys


def read() -> list:
    """[version, previous, boots, failed, dir, previous dir]: names or None, boots an int or None."""
    try:
        with open("firmware.txt") as f:
            fields = f.read().split()
    except OSError:
        fields = ()
    if len(fields) != 6:  # none (the deployed version), or damaged: boot the root
        return [None, None, None, None, None, None]
    value = [None if v == "-" else v for v in fields]
    value[2] = int(value[2]) if value[2] and value[2].isdigit() else None
    return value


def replace(path, text) -> None:
    """Replace a file whole: a new one renamed over it."""
    with open(path + ".new", "w") as f:
        f.write(text)
    os.rename(path + ".new", path)


def write(value) -> None:
    """Replace the pointer with `value`, and `main.py` with the boot it needs (module docstring)."""
    text = "import app\n"  # the deployed version, as deploy.py writes it
    if value[0]:
        text = "import sys\nsys.path.insert(0, \"%s\")\n" % value[4]
    if value[2] is not None:
        replace("main.py.trial", "# Written by fwboot.py: a version on trial did not reach its first telemetry.\n"
                "__import__(\"fwboot\").start()\n")
        text = ("# Written by fwboot.py: the first boot of a version on trial.\nimport os\n"
                "os.rename(\"main.py.trial\", \"main.py\")\n%ssys.modules[\"fwboot\"] = None\n"
                "try:\n    import app\nexcept Exception as e:\n"
                "    sys.modules[\"fwboot\"] = None  # (the app removes it when it accepts)\n"
                "    del sys.modules[\"fwboot\"]\n    __import__(\"fwboot\").reset(e)\n") % text
    elif value[0]:
        text = "# Written by fwboot.py: an accepted update.\n%simport app\n" % text
    replace("firmware.txt", " ".join(["-" if v is None else str(v) for v in value]))
    replace("main.py", text)


def back(value, reason) -> None:
    """Roll the pointer `value` back from its version on trial; the update record says why."""
    print("firmware %s rolled back: %s" % (value[0], reason))
    replace("update.json", json.dumps({"state": "rolled_back", "version": value[0], "reason": reason}))
    write([value[1], None, None, value[0], value[5], None])


def start() -> None:
    """Run by `main.py` when a version on trial did not get to accept itself: roll it back. (A pointer
    not on trial gets its `main.py` back.) Then reset the board."""
    value = read()
    if value[2] is None:
        write(value)
    else:
        back(value, "no telemetry after its trial boot")
    reset(None)


def reset(e) -> None:
    """Reset the board; `e` raised out of the application: a version on trial is rolled back first,
    otherwise e goes on (as before updates existed)."""
    if e is not None:
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
    """The version on trial reached its first telemetry: it stays. The app calls this once, after
    importing this module again in place of the mark (and closing its connection). The board is
    reset into the accepted form of `main.py`: the trial boot's heap holds its `main.py` (the rename,
    the mark, the handler) and this module's names, which a board running for months should not."""
    del sys.modules["fwboot"]
    value = read()
    if value[2] is not None:
        value[2] = None
        write(value)
        try:
            os.remove("update.json")
        except OSError:
            pass
        print("firmware %s accepted" % value[0])
        reset(None)
