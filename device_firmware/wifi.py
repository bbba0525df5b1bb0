"""Station-mode Wi-Fi for the ESP32 and Pico W ports: association with backoff, and its status.

Never blocks: `up()` is called from the thermostat's loop before each MQTT connection attempt, so
heating goes on while the radio associates. A failed or timed-out attempt is retried after an
exponential backoff with jitter (a power cut brings a building's thermostats back at once). Status
names come from the port's own `network.STAT_*` constants, so the same code reads the ESP32's
(1000-range, 200-range reasons) and the Pico W's (CYW43: negative failure codes).

`network` is passed in: on boards it is the built-in module; the unix port has none (no radio), and
the tests pass a stand-in. Imported only when the config names an SSID.
"""

import random
import time


class Station:
    def __init__(self, network, ssid, password, backoff_min_ms=1000, backoff_max_ms=60000,
                 connect_timeout_ms=15000):
        self.wlan = network.WLAN(network.STA_IF)
        self.wlan.active(True)
        self.ssid = ssid
        self.password = password
        self.backoff_min_ms = backoff_min_ms
        self.backoff_max_ms = backoff_max_ms
        self.backoff_ms = backoff_min_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.connecting = getattr(network, "STAT_CONNECTING", 1)
        self.names = {getattr(network, n): n[5:].lower() for n in dir(network) if n.startswith("STAT_")}
        self.started = None  # ticks_ms of the attempt in progress
        self.retry_at = time.ticks_ms()
        self.attempts = 0  # since the last time it was up
        self.last_failure = None

    def up(self) -> bool:
        """True when associated with an address; otherwise starts or judges an attempt, never waits."""
        if self.wlan.isconnected():
            if self.started is not None:
                print("wifi: up after %d attempt(s)" % self.attempts)
                self.started = None
                self.attempts = 0
                self.backoff_ms = self.backoff_min_ms
            return True
        now = time.ticks_ms()
        if self.started is not None:
            status = self.wlan.status()
            if status == self.connecting and time.ticks_diff(now, self.started) < self.connect_timeout_ms:
                return False
            self.last_failure = "timeout" if status == self.connecting else self.names.get(status, str(status))
            print("wifi: attempt %d failed: %s" % (self.attempts, self.last_failure))
            self.wlan.disconnect()
            self.started = None
            wait = self.backoff_ms
            self.backoff_ms = min(self.backoff_ms * 2, self.backoff_max_ms)
            self.retry_at = time.ticks_add(now, wait // 2 + random.getrandbits(16) % (wait // 2 + 1))
            return False
        if time.ticks_diff(now, self.retry_at) >= 0:
            self.attempts += 1
            self.started = now
            self.wlan.connect(self.ssid, self.password)
        return False

    def status(self) -> dict:
        """For telemetry: link status name, RSSI when up, attempts since last up, last failure."""
        connected = self.wlan.isconnected()
        status = self.wlan.status()
        return {"status": self.names.get(status, str(status)), "rssi": self.wlan.status("rssi") if connected else None,
                "attempts": self.attempts, "last_failure": self.last_failure}
