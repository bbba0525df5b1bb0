# The updater's reply handling under MicroPython, against hostile replies: whatever arrives on its
# response topic with its correlation data (the only replies it reads), it never raises out of the
# MQTT callback, never writes outside its directory (fw/a) and its request, and ends in an outcome
# telemetry can report (or goes on downloading).
import json
import os
import random

import board_sim
import config
import ota_updater
from check import eq
from mqtt5_codec import CORRELATION_DATA, Oversized

OUTCOMES = ("waiting", "refused")


def updater_in(tmp):
    try:
        os.mkdir(tmp)
    except OSError:
        pass
    os.chdir(tmp)
    with open("config.json", "w") as f:
        json.dump({"thermostat": "t-fuzz", "state_file": "sp.json"}, f)
    with open("update.pending", "w") as f:
        json.dump({"version": "0.2.0", "fw": "0.1.0"}, f)
    relay = board_sim.SimulatedRelay()
    updater = ota_updater.start(config.load_config("config.json"), board_sim.SimulatedRoom(relay), relay,
                                board_sim.NoWatchdog(), board_sim.restart)
    updater._start()
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
        if updater.outcome is not None:
            if updater.outcome[0] not in OUTCOMES:
                raise AssertionError("outcome %r" % (updater.outcome,))
            updater = updater_in(".")  # start again: the fuzz goes on from a fresh manifest
    for name in os.listdir("."):
        if name not in ("config.json", "fw", "update.pending"):
            raise AssertionError("wrote %r" % name)


def test_a_reply_larger_than_asked_or_oversized_is_waited_on_not_written():
    updater = updater_in("/tmp/mp-ota-big-%d" % random.getrandbits(24))
    reply(updater, memoryview(b"$%d\r\n%s\r\n" % (updater.chunk + 1, b"x" * (updater.chunk + 1))))
    eq(updater.outcome[0], "waiting")
    updater = updater_in(".")
    reply(updater, Oversized(5000, memoryview(b"$5000\r\n")))
    eq(updater.outcome[0], "waiting")
    eq(os.stat("fw/a/manifest.txt")[6] if "manifest.txt" in os.listdir("fw/a") else 0, 0)


def test_the_relay_holds_the_last_good_set_point_with_the_thermostats_hysteresis():
    updater = updater_in("/tmp/mp-ota-hold-%d" % random.getrandbits(24))
    eq(updater.set_point, 20.0)  # no copy in flash: the config's default, as the thermostat
    with open("sp.json", "w") as f:
        json.dump({"set_point": 25.5, "version": None}, f)
    updater = updater_in(".")
    eq(updater.set_point, 25.5)
    updater.sensor.temp = 25.2  # within the hysteresis (0.5): holds off
    updater._hold()
    eq(updater.relay.value(), 0)
    updater.sensor.temp = 24.9
    updater._hold()
    eq(updater.relay.value(), 1)
    updater.sensor.temp = 25.9
    updater._hold()
    eq(updater.relay.value(), 1)  # hold on until set point + hysteresis
    updater.sensor.temp = 26.1
    updater._hold()
    eq(updater.relay.value(), 0)
    with open("sp.json", "w") as f:
        json.dump({"set_point": 99, "version": None}, f)  # out of range: the default
    eq(updater_in(".").set_point, 20.0)


def test_a_damaged_request_is_refused_and_removed_not_a_dead_board():
    for junk in ('{"version": 7}', "[]", "{", "\x00\xff", '{"fw": "0.1.0"}'):
        updater = updater_in("/tmp/mp-ota-junk-%d" % random.getrandbits(24))
        with open("update.pending", "w") as f:
            f.write(junk)
        relay = board_sim.SimulatedRelay()
        updater = ota_updater.start(config.load_config("config.json"), board_sim.SimulatedRoom(relay), relay,
                                    board_sim.NoWatchdog(), board_sim.restart)
        try:
            updater.run()
        except SystemExit as e:  # board_sim.restart: the reset, into the thermostat
            eq(e.args, (3,))
        eq("update.pending" in os.listdir("."), False)
        with open("update.json") as f:
            eq(json.load(f)["state"], "refused")
