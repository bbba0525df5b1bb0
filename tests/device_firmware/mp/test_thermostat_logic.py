# Unit tests of the I/O-free decisions in device_firmware/thermostat.py under MicroPython.
import json
import os

import config
import thermostat
from check import eq, raises

TMP = "/tmp/fw-test-%d" % (os.urandom(2)[0] * 256 + os.urandom(1)[0])


def test_parse_set_point_accepts_numbers_in_range():
    eq(thermostat.parse_set_point(b"21.5", 5, 30), 21.5)
    eq(thermostat.parse_set_point(b" 5 ", 5, 30), 5.0)
    eq(thermostat.parse_set_point("30", 5, 30), 30.0)


def test_parse_set_point_rejects_garbage_and_out_of_range():
    eq(str(raises(ValueError, thermostat.parse_set_point, b"warm", 5, 30)), "not a number")
    eq(str(raises(ValueError, thermostat.parse_set_point, b"", 5, 30)), "empty")
    eq(str(raises(ValueError, thermostat.parse_set_point, b"nan", 5, 30)), "not a number")
    eq(str(raises(ValueError, thermostat.parse_set_point, b"inf", 5, 30)), "not a number")
    eq(str(raises(ValueError, thermostat.parse_set_point, b"\xff\xfe", 5, 30)), "not UTF-8")
    eq(str(raises(ValueError, thermostat.parse_set_point, b"1e999", 5, 30)), "not finite")
    eq(str(raises(ValueError, thermostat.parse_set_point, b"9" * 32, 5, 30)), "out of range [5, 30]")
    eq(str(raises(ValueError, thermostat.parse_set_point, b"9" * 33, 5, 30)), "too long (33 bytes)")
    for loose in (b".", b"1__0", b"1_0", b"infinity", b"1e", b"+", b"0x10", b"1 2", b"\xd9\xa1"):
        eq(str(raises(ValueError, thermostat.parse_set_point, loose, 5, 30)).startswith("not "), True)
    eq(str(raises(ValueError, thermostat.parse_set_point, b"31", 5, 30)).startswith("out of range"), True)
    eq(str(raises(ValueError, thermostat.parse_set_point, b"-40", 5, 30)).startswith("out of range"), True)


def test_parse_set_point_reads_negative_zero_as_zero_and_any_decimal_form():
    eq(str(thermostat.parse_set_point(b"-0", -5, 30)), "0.0")
    eq(thermostat.parse_set_point(b"+2.5e1", 5, 30), 25.0)
    eq(thermostat.parse_set_point(b".5e1", 5, 30), 5.0)
    eq(thermostat.parse_set_point(b"21.", 5, 30), 21.0)
    eq(thermostat.parse_set_point(21, 5, 30), 21.0)  # the copy in flash is a JSON number


def test_hysteresis():
    on = thermostat.heater_should_be_on
    eq(on(19.4, 20, 0.5, False), True)
    eq(on(19.8, 20, 0.5, False), False)  # inside the band: hold off
    eq(on(19.8, 20, 0.5, True), True)    # inside the band: hold on
    eq(on(20.5, 20, 0.5, True), False)


def test_alerts():
    eq(thermostat.alerts_for(None, 5, 35), ("sensor_failure",))
    eq(thermostat.alerts_for(36, 5, 35), ("over_temperature",))
    eq(thermostat.alerts_for(4, 5, 35), ("under_temperature",))
    eq(thermostat.alerts_for(20, 5, 35), ())


def test_set_point_persists_last_good_value_and_reports_rejects():
    path = TMP + "-sp.json"
    sp = thermostat.SetPoint(path, 20.0, 5, 30)
    eq((sp.value, sp.source), (20.0, "default"))
    eq(sp.offer(b"23", "000000000001000:00001:s", "get"), True)
    eq(sp.offer(b"abc", "000000000001001:00000:s", "notify"), False)
    eq(sp.value, 23.0)
    eq(sp.rejected, {"value": "abc", "size": 3, "reason": "not a number", "source": "notify"})
    eq(sp.offer(b"\xff" * 40, None, "get"), False)
    eq(sp.rejected, {"value": None, "size": 40, "reason": "too long (40 bytes)", "source": "get"})
    eq(sp.offer(b"2\xff", None, "get"), False)
    eq(sp.rejected, {"value": "hex:32ff", "size": 2, "reason": "not UTF-8", "source": "get"})
    again = thermostat.SetPoint(path, 20.0, 5, 30)  # a reboot
    eq((again.value, again.source, again.version), (23.0, "flash", None))
    os.remove(path)


def test_set_point_ignores_older_versions():
    path = TMP + "-ver.json"
    sp = thermostat.SetPoint(path, 20.0, 5, 30)
    sp.offer(b"25", "000000000002000:00000:s", "notify")
    eq(sp.offer(b"22", "000000000001999:00009:s", "get"), False)
    eq(sp.value, 25.0)
    os.remove(path)


def test_corrupt_flash_copy_falls_back_to_default():
    path = TMP + "-bad.json"
    with open(path, "w") as f:
        f.write("{not json")
    eq(thermostat.SetPoint(path, 19.0, 5, 30).value, 19.0)
    with open(path, "w") as f:
        json.dump({"set_point": 99}, f)  # out of range: not trusted either
    eq(thermostat.SetPoint(path, 19.0, 5, 30).value, 19.0)
    os.remove(path)


def test_load_config_merges_defaults_and_requires_a_name():
    path = TMP + "-cfg.json"
    with open(path, "w") as f:
        json.dump({"thermostat": "t-9", "timing": {"control_ms": 50}}, f)
    loaded = config.load_config(path)
    eq(loaded["thermostat"], "t-9")
    eq(loaded["timing"]["control_ms"], 50)
    eq(loaded["timing"]["telemetry_ms"], config.DEFAULTS["timing"]["telemetry_ms"])
    with open(path, "w") as f:
        json.dump({"broker": {}}, f)
    raises(ValueError, config.load_config, path)
    os.remove(path)


def test_set_point_key_has_a_literal_backslash():
    app, _ = offline_thermostat(FakeSensor(20.0))
    eq(app.key, b"t-unit\x5csetPoint")


class FakeSensor:
    def __init__(self, temp):
        self.temp = temp

    def read(self):
        if self.temp is None:
            raise OSError("no sensor")
        return self.temp


def offline_thermostat(sensor):
    import board_sim
    path = TMP + "-app.json"
    with open(path, "w") as f:
        json.dump({"thermostat": "t-unit", "state_file": TMP + "-app-sp.json"}, f)
    relay = board_sim.SimulatedRelay()
    return thermostat.Thermostat(config.load_config(path), sensor, relay, board_sim.NoWatchdog(), board_sim.restart), relay


def test_failed_sensor_switches_the_heater_off_and_alerts_once():
    sensor = FakeSensor(18.0)
    app, relay = offline_thermostat(sensor)
    app.control()
    eq((app.heater, relay.value()), (True, 1))
    sensor.temp = None
    for _ in range(3):
        app.control()
    eq((app.heater, relay.value(), app.temperature), (False, 0, None))
    eq([a["alert"] for a in app.pending_alerts], ["sensor_failure"])  # offline: queued, once
    eq(app.telemetry()["temperature"], None)


def test_alerts_queued_offline_are_bounded_to_the_newest_eight():
    sensor = FakeSensor(None)
    app, _ = offline_thermostat(sensor)
    for i in range(12):
        sensor.temp = None if i % 2 == 0 else 20.0  # every failure is a new episode
        app.control()
    eq(len(app.pending_alerts), 6)
    for i in range(8):
        sensor.temp = None if i % 2 == 0 else 20.0
        app.control()
    eq(len(app.pending_alerts), 8)


class Stop(BaseException):
    """Ends Thermostat.run() in a test (the last-resort handler catches Exception only)."""


class FlakySensor:
    """Raises an unexpected exception `failures` times, then reads 18 C, then stops the run."""

    def __init__(self, failures):
        self.failures = failures
        self.reads = 0

    def read(self):
        self.reads += 1
        if self.reads <= self.failures:
            raise ZeroDivisionError("bug %d" % self.reads)
        if self.reads > self.failures + 2:
            raise Stop()
        return 18.0


def test_main_loop_survives_unexpected_exceptions_and_reports_them():
    app, relay = offline_thermostat(FlakySensor(3))
    app.timing["control_ms"] = 1
    app.retry_at = 2 ** 29  # stay offline: this test is about the loop
    raises(Stop, app.run)
    eq((app.heater, relay.value()), (True, 1))  # it went back to work
    eq((app.telemetry()["faults"], app.telemetry()["last_fault"]), (3, "ZeroDivisionError: bug 3"))


def test_too_many_faults_in_a_row_restart_the_device():
    restarts = []
    app, _ = offline_thermostat(FlakySensor(100))

    def restart():
        restarts.append(app.doc["faults"])  # telemetry's count
        raise Stop()

    app.restart = restart
    app.timing["control_ms"] = 1
    app.retry_at = 2 ** 29
    raises(Stop, app.run)
    eq(restarts, [11])  # MAX_FAULTS = 10 survived, the 11th within ten minutes restarts


class LinkDown:
    """A Wi-Fi station that never comes up (wifi.Station's interface)."""

    def __init__(self):
        self.polls = 0

    def up(self):
        self.polls += 1
        return False

    def status(self):
        return {"status": "no_ap_found", "rssi": None, "attempts": self.polls, "last_failure": "no_ap_found"}


def test_no_mqtt_attempt_while_wifi_is_down_and_its_status_is_in_telemetry():
    app, _ = offline_thermostat(FakeSensor(20.0))
    app.link = LinkDown()
    backoff = app.backoff_ms
    app._connect()
    eq((app.connected, app.mqtt.sock, app.backoff_ms, app.link.polls), (False, None, backoff, 1))
    eq(app.telemetry()["wifi"]["status"], "no_ap_found")
