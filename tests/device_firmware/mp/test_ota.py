# ota.offer (the thermostat's side of an update) against hostile desired values and update records: it
# never raises, asks for the updater only with a request the updater can read (a JSON object naming a
# version string), and a recorded outcome for the same value stands when read at registration (no
# reboot loop), while a notification (the key written again) tries once more.
import json
import os
import random

import ota
import resp3
from check import eq


class Restarted(Exception):
    pass


class Link:  # the MQTT client's one call ota.offer makes
    def disconnect(self):
        raise OSError("already closed")  # a dead connection must not stop the restart


class App:  # the Thermostat's two attributes ota.offer uses
    mqtt = Link()

    def restart(self):
        raise Restarted()


def fresh(tmp):
    try:
        os.mkdir(tmp)
    except OSError:
        pass
    os.chdir(tmp)
    for name in os.listdir("."):
        os.remove(name)


def offer(raw, source="notify"):
    """The record offer returns, or the request it wrote before restarting."""
    try:
        return ota.offer(App(), raw, source)
    except Restarted:
        with open("update.pending") as f:
            request = json.load(f)
        os.remove("update.pending")
        return request


def test_any_value_asks_for_the_updater_with_a_readable_request_or_returns_a_record():
    fresh("/tmp/mp-ota-door-%d" % random.getrandbits(24))
    values = [b"", b"\xff\xfe", b"../../etc", b"0.2.0", b"\x00" * 40, resp3.TooLong(5000), b"x" * 300, b"\"},{"]
    for _ in range(100):
        values.append(bytes(random.getrandbits(8) for _ in range(random.getrandbits(5))))
    for raw in values:
        got = offer(raw)
        if not isinstance(got, dict) or not isinstance(got.get("version"), str):
            raise AssertionError("%r -> %r" % (raw, got))
    eq(sorted(os.listdir(".")), [])


def test_a_recorded_outcome_stands_at_registration_and_is_retried_when_notified():
    fresh("/tmp/mp-ota-record-%d" % random.getrandbits(24))
    for state in ("refused", "waiting"):
        with open("update.json", "w") as f:
            json.dump({"state": state, "version": "0.2.0", "reason": "r"}, f)
        eq(offer(b"0.2.0", "get")["state"], state)  # no restart at registration: no reboot loop
        eq(offer(b"0.2.0", "notify"), {"version": "0.2.0", "fw": "0.1.0"})  # written again: try again
        eq(offer(b"0.3.0", "get")["version"], "0.3.0")  # another version: go
        assert "state" not in offer(b"0.3.0", "get")
    with open("update.json", "w") as f:
        json.dump({"state": "rolled_back", "version": "0.2.0", "reason": "r"}, f)
    eq(offer(b"0.2.0", "notify")["state"], "rolled_back")  # never again
    with open("update.json", "w") as f:
        json.dump({"state": "rebooting", "version": "0.2.0"}, f)
    eq(offer(b"0.2.0", "get"), {"version": "0.2.0", "fw": "0.1.0"})  # a switch cut short: made again
    for junk in ("[1]", "{", "\xff", ""):
        with open("update.json", "w") as f:
            f.write(junk)
        eq(offer(b"0.2.0", "get"), {"version": "0.2.0", "fw": "0.1.0"})
