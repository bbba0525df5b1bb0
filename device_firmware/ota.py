"""Over-the-air updates, the thermostat's side: record the update wanted, and restart into the updater.

The thermostat imports this module only while its desired version (`<thermostat>\\desiredFirmware`)
differs from its own. It does not download anything: the updater (`ota_updater.py`, its MQTT client, a
4 KB receive buffer, the signature check) does not fit beside a running thermostat in a 64 KB heap
(16 KB free, in pieces). So this writes the request `update.pending`, `{"version": <wanted>, "fw":
<ours>}` (a new file renamed into place: a power cut leaves it whole or absent), and resets the board.
At boot `app.py` finds the request and runs the updater instead of the thermostat, with the whole
heap; the updater writes its outcome into the update record `update.json`, removes the request and
resets again: into the new version on trial (fwboot.py), or back into this one, which then reports the
outcome (`status()`: telemetry's `update`) and does not try that version again (refused, rolled back),
unless the gateway only said "not now" (`waiting`: tried again after 10 x `backoff_max_ms`).

No restart while this version is itself on trial (`fwboot` loaded): fwboot would count it as a failed
boot and roll back. The thermostat accepts the version at its first telemetry, and the update follows.

Heap: after this module unloads (no update wanted any more) the names it interned stay, and the
running thermostat holds most of the 300 qstrs four pools take (a name over that allocates a fifth
pool, 3.6 KB in the middle of the heap, for good: the largest free block fell from 4.2 KB to 0.9 KB).
So its names are ones the thermostat already has (`Updater`, `offer`, `poll`, `status`, `version`,
`retry_at`, `doc` ...); the file names are literals over 10 characters (stored as strings, not qstrs).
"""

import json
import os
import sys
import time


class Updater:
    """The update `app` (the `Thermostat`) is asked to make, or the outcome of the last attempt."""

    def __init__(self, app):
        self.app = app
        self.version = None
        self.doc = None  # telemetry's `update`: {"state", "version", ...}
        self.retry_at = None  # ticks_ms when a `waiting` outcome is tried again

    def offer(self, raw) -> bool:
        """The desired version (a state store value: bytes or resp3.TooLong; None when the thermostat
        runs what is wanted). False: no update any more, and this module is unloaded."""
        if raw is None:
            print("update: none wanted now")
            del sys.modules["ota"]
            return False
        try:
            version = raw.decode()  # its form is checked by the updater, which records a refusal
        except (AttributeError, UnicodeError):  # resp3.TooLong, or not UTF-8: no version name
            version = None
        if version is None:
            self.version, self.retry_at = None, None
            self.doc = {"state": "refused", "version": None, "reason": "not a version name (1-32 of A-Za-z0-9._-)"}
            return True
        if version == self.version:
            return True
        self.version, self.retry_at = version, None
        try:
            with open("update.json") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            doc = None
        # An outcome for this version stands (refused, rolled back: publish another version); any
        # other record (none, another version's, rebooting: a reset cut the switch short) means go.
        if not isinstance(doc, dict) or doc.get("version") != version or doc.get("state") not in (
                "refused", "rolled_back", "waiting"):
            doc = {"state": "pending", "version": version}
        elif doc["state"] == "waiting":
            self.retry_at = time.ticks_add(time.ticks_ms(), 10 * self.app.timing["backoff_max_ms"])
        self.doc = doc
        return True

    def poll(self) -> None:
        """One turn of the main loop, while registered: restart into the updater if one is due."""
        if self.retry_at is not None and time.ticks_diff(time.ticks_ms(), self.retry_at) >= 0:
            self.retry_at = None
            self.doc = {"state": "pending", "version": self.version}
        if self.doc["state"] != "pending" or "fwboot" in sys.modules:
            return
        from thermostat import VERSION
        with open("update.new", "w") as f:
            json.dump({"version": self.version, "fw": VERSION}, f)
        os.rename("update.new", "update.pending")
        print("update: %s wanted, restarting into the updater" % self.version)
        try:
            self.app.mqtt.disconnect()
        except OSError:
            pass
        self.app.restart()

    def status(self) -> dict:
        return self.doc
