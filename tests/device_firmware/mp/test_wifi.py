# device_firmware/wifi.py under MicroPython with a stand-in `network` module (the unix port has no
# radio). The stand-in follows the Pico W's CYW43 status codes; what is tested is the bring-up
# logic: never blocking, backoff between failed attempts, the status names, recovery.
import time

import wifi
from check import eq


class FakeWLAN:
    def __init__(self, net):
        self.net = net
        self.connected = False
        self.state = net.STAT_IDLE
        self.calls = []

    def active(self, on):
        self.calls.append(("active", on))

    def connect(self, ssid, password):
        self.calls.append(("connect", ssid, password))
        self.state = self.net.STAT_CONNECTING

    def disconnect(self):
        self.calls.append(("disconnect",))
        self.state = self.net.STAT_IDLE

    def isconnected(self):
        return self.connected

    def status(self, param=None):
        if param == "rssi":
            return -61
        return self.state


class FakeNetwork:
    STA_IF = 0
    STAT_IDLE = 0
    STAT_CONNECTING = 1
    STAT_WRONG_PASSWORD = -3
    STAT_NO_AP_FOUND = -2
    STAT_CONNECT_FAIL = -1
    STAT_GOT_IP = 3

    def __init__(self):
        self.wlan = None

    def WLAN(self, interface):
        self.wlan = FakeWLAN(self)
        return self.wlan


def up_until(station, done, limit_ms=10000):
    """Call up() as the thermostat's loop would until done() holds; returns the results. Ends on the
    event, not after a fixed time: a process descheduled on a busy host for longer than that time used to
    call up() once and see nothing. limit_ms only bounds a station that never gets there."""
    seen = []
    end = time.ticks_add(time.ticks_ms(), limit_ms)
    while not done() and time.ticks_diff(end, time.ticks_ms()) > 0:
        seen.append(station.up())
        time.sleep_ms(5)
    return seen


def test_station_connects_once_and_reports_up_when_associated():
    net = FakeNetwork()
    st = wifi.Station(net, "plant-net", "secret", 50, 400, connect_timeout_ms=100)
    eq(net.wlan.calls, [("active", True)])
    eq(st.up(), False)
    eq(net.wlan.calls[-1], ("connect", "plant-net", "secret"))
    eq(st.up(), False)  # still connecting: no second connect, no wait
    eq(len([c for c in net.wlan.calls if c[0] == "connect"]), 1)
    net.wlan.connected, net.wlan.state = True, net.STAT_GOT_IP
    eq(st.up(), True)
    eq(st.status(), {"status": "got_ip", "rssi": -61, "attempts": 0, "last_failure": None})


def test_failures_are_named_and_retried_with_growing_backoff():
    net = FakeNetwork()
    st = wifi.Station(net, "plant-net", "wrong", 40, 160, connect_timeout_ms=1000)
    connects = []
    for _ in range(4):
        st.up()
        connects.append(time.ticks_ms())
        net.wlan.state = net.STAT_WRONG_PASSWORD
        while st.started is not None:
            st.up()
        while st.started is None:
            st.up()
            time.sleep_ms(2)
    gaps = [time.ticks_diff(b, a) for a, b in zip(connects, connects[1:])]
    eq(st.last_failure, "wrong_password")
    eq(st.status()["status"], "connecting")
    eq(st.attempts, 5)
    # Backoff 40, 80, 160 ms (jitter: half to all of it): each wait at least half the nominal one.
    eq([g >= n // 2 for g, n in zip(gaps, (40, 80, 160))], [True, True, True])
    eq(gaps[2] > gaps[0], True)


def test_an_attempt_that_hangs_times_out_and_recovery_resets_the_backoff():
    net = FakeNetwork()
    st = wifi.Station(net, "plant-net", "secret", 20, 400, connect_timeout_ms=30)
    # The access point never answers: CONNECTING until the timeout ends the attempt.
    results = up_until(st, lambda: st.last_failure is not None)
    eq(True in results, False)
    eq(st.last_failure, "timeout")
    eq(st.backoff_ms >= 40, True)
    while st.started is None:  # the next attempt, after the backoff
        st.up()
        time.sleep_ms(2)
    net.wlan.connected = True
    eq(st.up(), True)
    eq((st.attempts, st.backoff_ms), (0, 20))
