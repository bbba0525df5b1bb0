"""Over-the-air updates, the thermostat's side: restart into the updater, or say why not.

The thermostat imports this module only when its desired version (`<thermostat>\\desiredFirmware`)
differs from its own, calls `offer` once and unloads it again. Nothing is downloaded here: the updater
(`ota_updater.py`, its MQTT client, a 4 KB receive buffer, the signature check) does not fit beside a
running thermostat in a 64 KB heap (16 KB free, in pieces). So `offer` writes the request
`update.pending`, `{"version": <wanted>, "fw": <ours>}` (a new file renamed into place: a power cut
leaves it whole or absent), and resets the board. At boot app.py finds the request and runs the
updater instead of the thermostat, with the whole heap; the updater writes its outcome into the update
record `update.json`, removes the request and resets again: into the new version on trial (fwboot.py),
or back into this one.

Back here, the record for the version still wanted is what telemetry reports (`update`), and it stands
when the thermostat registers (a GET at boot, after every reconnect), so a refused bundle or a version
the gateway does not have (`refused`, `waiting`) is no reboot loop: it is tried again when the key is
written again (a notification: `appliance firmware publish` once more). A version that failed its trial
(`rolled_back`) is not tried again at all: publish another one. A record `rebooting` is a switch a
reset cut short: the update is made again (every file is then found verified on flash).

No restart while this version is itself on trial (main.py's mark `fwboot` in sys.modules): fwboot
would take the next boot as a failed trial and roll it back. Accepting the version resets the board
(`Thermostat.accept`), and the GET at the next registration makes the update then.

Heap: the names interned here stay after the module is gone, and the thermostat holds 298 of the 300
qstrs four pools take once it has read an update record; one more allocates a fifth pool, 3.5 KB
in the middle of the heap, for good. So: one function named as the thermostat's `offer`, arguments
named as its own, state names compared as few times as possible, file names over 10 characters
(literals that long are strings, not qstrs).
"""

import json
import os
import sys


def offer(app, raw, source):
    """The update of `app` (the `Thermostat`) to the desired version `raw` (a state store value: bytes
    or resp3.TooLong) read from `source` ("get" or "notify"): the record telemetry reports, or None
    after restarting the board into the updater (on boards machine.reset() does not return)."""
    try:
        version = raw.decode()  # its form is checked by the updater, which refuses what is no version
    except (AttributeError, UnicodeError):  # resp3.TooLong, or not UTF-8: the updater refuses it
        version = "(not UTF-8 or too long)"
    try:
        with open("update.json") as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = None
    if (isinstance(record, dict) and record.get("version") == version and record.get("state") != "rebooting"
            and (source == "get" or record.get("state") == "rolled_back")):
        return record
    if "fwboot" in sys.modules:
        return {"state": "waiting", "version": version, "reason": "this version is on trial"}
    from thermostat import VERSION
    with open("update.pending.new", "w") as f:
        json.dump({"version": version, "fw": VERSION}, f)
    os.rename("update.pending.new", "update.pending")
    print("update: %s wanted, restarting into the updater" % version)
    try:
        app.mqtt.disconnect()
    except OSError:
        pass
    app.restart()
    return None
