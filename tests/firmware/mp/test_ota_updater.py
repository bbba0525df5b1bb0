# The updater's reply handling under MicroPython, against hostile replies: whatever arrives on its
# response topic with its correlation data (the only replies it reads), it never raises out of the
# MQTT callback, never writes outside firmware/<version>/, and ends in a state telemetry can report.
import json
import os
import random

import board_sim
import config
import ota_updater
import thermostat
from check import eq
from mqtt5_codec import CORRELATION_DATA, Oversized

STATES = ("downloading", "waiting", "refused")


def updater_in(tmp):
    try:
        os.mkdir(tmp)
    except OSError:
        pass
    os.chdir(tmp)
    with open("config.json", "w") as f:
        json.dump({"thermostat": "t-fuzz", "state_file": "sp.json"}, f)
    app = thermostat.Thermostat(config.load_config("config.json"), board_sim.SimulatedRoom(board_sim.SimulatedRelay()),
                                board_sim.SimulatedRelay(), board_sim.NoWatchdog(), board_sim.restart)
    updater = ota_updater.Updater(app)
    updater.offer(b"0.2.0")
    return updater


def reply(updater, payload):
    updater.corr = b"fuzz"
    updater.on_message(updater.resp.encode(), payload, {CORRELATION_DATA: b"fuzz"})


def test_random_replies_never_raise_and_leave_a_reportable_state():
    updater = updater_in("/tmp/mp-ota-fuzz-%d" % random.getrandbits(24))
    pieces = [b"$", b"-ERR ", b"+OK", b"*2", b":1", b"\r\n", b"5", b"384", b"-1", b"\x00", b"\xff", b"x" * 400,
              b"thermostat-fw 0.2.0 6\n", b"app.mpy 10 " + b"a" * 64 + b"\n", b"../../etc 1 " + b"0" * 64 + b"\n"]
    for _ in range(300):
        payload = b"".join(random.choice(pieces) for _ in range(random.getrandbits(3)))
        if random.getrandbits(2) == 0:
            payload = b"$%d\r\n%s\r\n" % (len(payload), payload)
        reply(updater, memoryview(payload))
        if updater.state not in STATES:
            raise AssertionError("state %r" % updater.state)
        if updater.state != "downloading":  # start again: the fuzz goes on from a fresh manifest
            updater.version = None
            updater.offer(b"0.2.0")
    for name in os.listdir("."):
        if name not in ("config.json", "firmware", "sp.json"):
            raise AssertionError("wrote %r" % name)


def test_a_reply_larger_than_asked_or_oversized_is_waited_on_not_written():
    updater = updater_in("/tmp/mp-ota-big-%d" % random.getrandbits(24))
    reply(updater, memoryview(b"$%d\r\n%s\r\n" % (updater.chunk + 1, b"x" * (updater.chunk + 1))))
    eq(updater.state, "waiting")
    updater.retry_at = None
    updater.state = "downloading"
    reply(updater, Oversized(5000, memoryview(b"$5000\r\n")))
    eq(updater.state, "waiting")
    eq(os.stat("firmware/0.2.0/manifest.txt")[6] if "manifest.txt" in os.listdir("firmware/0.2.0") else 0, 0)
