"""The thermostat application: hysteresis control, set point from the state store, telemetry.

The set point lives in the state store key `<thermostat>\\setPoint`. After every (re)connect
the thermostat subscribes to the key's notification topic and waits for the SUBACK, sends
KEYNOTIFY, then GETs the current value (registrations die with the connection, and the GET catches
up on changes made while it was away). Invalid values are ignored and reported in telemetry; the
last good one is kept in flash so a reboot without network still heats to it.

Heating never waits for the network: control runs on its own timer, the MQTT socket is polled
between ticks, and a lost connection is retried with exponential backoff while the room keeps
being controlled. Pure decisions (`parse_set_point`, `heater_should_be_on`, `alerts_for`) have no
I/O so they are unit-tested on their own.
"""

import binascii
import gc
import json
import sys
import os
import random
import time
from micropython import const

import hlc
import mqtt5
import statestore
from control import heap_headroom, heater_should_be_on
from mqtt5_codec import CONTENT_TYPE, MQTTProtocolError

VERSION = "0.1.0"  # the firmware version: bundle name, telemetry `fw`, `<thermostat>\\firmware`
_MAX_FAULTS = const(10)  # unexpected exceptions survived before a restart, if each follows the last ...
_FAULT_WINDOW_MS = const(600000)  # ... within ten minutes

_MAX_SET_POINT_BYTES = const(32)  # the longest value read as a number; anything longer is refused unread


def _is_decimal(text: bytes) -> bool:
    """[+-]digits[.digits][(e|E)[+-]digits], or .digits: the numbers a set point may be written as.
    Stricter than MicroPython's float(), which also takes "." and "1__0" and "inf"."""
    n = len(text)
    i = 1 if n and text[0] in b"+-" else 0
    start = i
    while i < n and 48 <= text[i] <= 57:
        i += 1
    digits = i - start
    if i < n and text[i] == 46:  # "."
        i += 1
        start = i
        while i < n and 48 <= text[i] <= 57:
            i += 1
        digits += i - start
    if not digits:
        return False
    if i < n and text[i] in b"eE":
        i += 1
        if i < n and text[i] in b"+-":
            i += 1
        start = i
        while i < n and 48 <= text[i] <= 57:
            i += 1
        if i == start:
            return False
    return i == n


def parse_set_point(raw, low: float, high: float) -> float:
    """The set point in a state store value (bytes, str or resp3.TooLong), or ValueError saying
    why it is unusable. Total: no byte sequence raises anything else."""
    if isinstance(raw, (int, float)):  # the copy in flash is JSON
        raw = str(raw)
    if isinstance(raw, str):
        raw = raw.encode()
    size = len(raw)
    if size > _MAX_SET_POINT_BYTES:
        raise ValueError("too long (%d bytes)" % size)
    text = bytes(raw).strip(b" \t")
    if not text:
        raise ValueError("empty")
    try:
        text.decode()
    except UnicodeError:
        raise ValueError("not UTF-8")
    if not _is_decimal(text):
        raise ValueError("not a number")
    value = float(text) + 0.0  # + 0.0 turns -0.0 into 0.0
    if value in (float("inf"), float("-inf")):
        raise ValueError("not finite")
    if not low <= value <= high:
        raise ValueError("out of range [%s, %s]" % (low, high))
    return value


def shown_value(raw):
    """A rejected value as telemetry can carry it: the text if short UTF-8, else hex of its head,
    None if it was never read (too long)."""
    if isinstance(raw, str):
        return raw[:_MAX_SET_POINT_BYTES]
    if len(raw) > _MAX_SET_POINT_BYTES:
        return None
    raw = bytes(raw)
    try:
        return raw.decode()
    except UnicodeError:
        return "hex:" + binascii.hexlify(raw).decode()


def alerts_for(temp, low: float, high: float) -> tuple:
    """The alert conditions active for a reading (temp None: the sensor failed)."""
    if temp is None:
        return ("sensor_failure",)
    if temp > high:
        return ("over_temperature",)
    if temp < low:
        return ("under_temperature",)
    return ()


def _version_key(version):
    """Order HLC versions; an unparseable or missing one sorts first."""
    try:
        return hlc.parse(version)[:2]
    except (ValueError, AttributeError, TypeError):
        return (0, 0)


class SetPoint:
    """The current set point, its state store version, the last rejected value, and its copy in flash."""

    def __init__(self, path: str, default: float, low: float, high: float):
        self.path = path
        self.low = low
        self.high = high
        self.value = default
        self.version = None
        self.source = "default"
        self.rejected = None  # {"value": ..., "reason": ...} of the last invalid value
        try:
            with open(path) as f:
                saved = json.load(f)
            self.value = parse_set_point(saved["set_point"], low, high)
            self.source = "flash"
            # The saved version is kept for diagnosis only: versions are compared within one run,
            # so a store with a different clock history can never lock the thermostat out.
        except (OSError, ValueError, KeyError, TypeError) as e:
            print("set point: no usable copy in flash (%s), using %s" % (e, default))

    def offer(self, raw, version, source: str) -> bool:
        """Apply a value from the store if it is valid and not older than the current one."""
        if version and self.version and _version_key(version) < _version_key(self.version):
            print("set point: ignoring older version", version)
            return False
        try:
            value = parse_set_point(raw, self.low, self.high)
        except ValueError as e:
            shown = shown_value(raw)
            self.rejected = {"value": shown, "size": len(raw), "reason": str(e), "source": source}
            print("set point: rejected %r (%d bytes) from %s: %s" % (shown, len(raw), source, e))
            return False
        changed = value != self.value
        self.value, self.version, self.source = value, version, source
        if changed:
            self._persist()
        print("set point", value, "from", source)
        return changed

    def _persist(self) -> None:
        # Write then rename, so a power cut leaves the old copy or the new one, never half of one.
        tmp = self.path + ".new"
        try:
            with open(tmp, "w") as f:
                json.dump({"set_point": self.value, "version": self.version}, f)
            os.rename(tmp, self.path)
        except OSError as e:
            print("set point: cannot persist:", e)


class Thermostat:
    def __init__(self, config: dict, sensor, relay, watchdog, restart, led=None, link=None):
        """led: a status LED (on while registered) or None; link: the Wi-Fi `wifi.Station` or None."""
        self.restart = restart
        self.led = led
        self.link = link
        self.name = config["thermostat"]
        # The set point key, `<thermostat>\\setPoint` (literal backslash, as in the spec's example).
        self.key = (self.name + "\\setPoint").encode()
        self.sensor = sensor
        self.relay = relay
        self.watchdog = watchdog
        timing = config["timing"]
        self.timing = timing
        self.hysteresis = config["hysteresis_c"]
        self.alert_limits = (config["alerts"]["low_c"], config["alerts"]["high_c"])
        sp = config["set_point"]
        self.set_point = SetPoint(config["state_file"], sp["default"], sp["min"], sp["max"])
        broker = config["broker"]
        self.mqtt = mqtt5.MQTTClient(self.name, broker["host"], broker["port"], broker["user"],
                                     broker["password"], keepalive=broker["keepalive"],
                                     timeout_ms=timing["request_timeout_ms"], buf_size=768)
        self.store = statestore.StateStoreClient(self.mqtt, hlc.HLC(self.name),
                                                 timing["request_timeout_ms"], self._on_notify,
                                                 max_value=_MAX_SET_POINT_BYTES)
        # The keys watched: the set point, and for over-the-air updates the version this thermostat
        # should run. While that names another version than ours, self.update is the record of the
        # update that ota.py could not make (it restarts into the updater otherwise).
        self.keys = (self.key, (self.name + "\\desiredFirmware").encode())
        self.update = None
        self.connected = False
        self.registered = False
        self.backoff_ms = timing["backoff_min_ms"]
        self.retry_at = time.ticks_ms()
        self.temperature = None
        self.heater = False
        self.active_alerts = ()
        self.pending_alerts = []  # alerts raised while offline, sent on reconnect
        self.control_now = True
        self.fault_run = (0, 0)  # (faults each within _FAULT_WINDOW_MS of the previous, ticks_ms of the last)
        self.doc = {"device": self.name, "fw": VERSION, "ts_ms": 0, "seq": 0, "temperature": None, "set_point": None,
                    "set_point_source": None, "set_point_rejected": None, "heater": False, "registered": False,
                    "mem_peak": 0, "mem_free": 0, "mem_largest": 0, "faults": 0, "last_fault": None, "wifi": None,
                    "update": None}  # telemetry's, filled in by telemetry()
        # The counters telemetry reports live in it, not in attributes of their own as well: each
        # attribute is a slot in this object's table for the run (docs/firmware.md, Memory). `seq`,
        # `mem_peak` (gc.mem_alloc(), highest seen), `mem_free`/`mem_largest` (heap_headroom() at the
        # last telemetry), `faults` (unexpected exceptions the main loop survived, since boot), `last_fault`.

    # --- state store ----------------------------------------------------------------------------

    def _on_notify(self, key, operation, value, version, source="notify") -> None:
        if key not in self.keys:
            print("notification for a key not ours:", key)
            return
        if operation != "SET":
            value = None
        if key != self.key:
            if value is None or value == VERSION.encode():
                if self.update:
                    print("update: none wanted now")
                self.update = None
            else:  # ota.py restarts into the updater, or returns the record of why not: telemetry's
                import ota
                del sys.modules["ota"]  # imported for this call only (heap)
                self.update = ota.offer(self, value, source)
        elif value is not None:
            if self.set_point.offer(value, version, source):
                self.control_now = True
        else:
            print("set point: key deleted, keeping", self.set_point.value)

    def _sync_clock(self) -> None:
        """Report our firmware version (`<thermostat>\\firmware`) and take the time from its version."""
        try:
            version = self.store.report(self.name + "\\firmware", VERSION)
            print("clock: %d ms off the gateway's, corrected" % hlc.set_wall_ms(hlc.parse(version)[0]))
            self.store.hlc.resync()
            self.store.hlc.receive(version)
        except statestore.StateStoreTimeout:
            raise
        except (statestore.StateStoreError, ValueError) as e:  # e.g. an ACL that forbids the SET
            print("clock: not synced from the gateway:", e)

    def _register(self) -> None:
        """Clock from the gateway, then subscribe (SUBACK), KEYNOTIFY, then GET: the order that
        loses no change."""
        self.store.start()
        self._sync_clock()
        for key in self.keys:
            self.store.watch(key)
            value, version = self.store.get(key)
            if value is not None or key != self.key:  # no set point stored: keep ours
                self._on_notify(key, "SET", value, version, "get")
        self.registered = True
        print("registered", self.key.decode())

    # --- connection -----------------------------------------------------------------------------

    def _connect(self) -> None:
        if self.link and not self.link.up():
            self.retry_at = time.ticks_add(time.ticks_ms(), 250)  # Wi-Fi keeps its own backoff: poll it
            return
        try:
            self.mqtt.connect(clean_session=True)
        except (OSError, mqtt5.MQTTException) as e:
            print("connect failed:", e)
            return self._backoff()
        self.connected = True
        self.registered = False
        print("connected")
        self._try_register()
        self._flush_alerts()

    def _try_register(self) -> None:
        try:
            self._register()
            self.backoff_ms = self.timing["backoff_min_ms"]
        except statestore.StateStoreError as e:
            print("register failed:", e)
            self._backoff()
        except (OSError, mqtt5.MQTTException, MQTTProtocolError) as e:
            print("register failed:", e)
            self._drop(e)

    def _backoff(self) -> None:
        wait = self.backoff_ms
        self.backoff_ms = min(self.backoff_ms * 2, self.timing["backoff_max_ms"])
        wait = wait // 2 + random.getrandbits(16) % (wait // 2 + 1)  # jitter: 20 devices, not one herd
        self.retry_at = time.ticks_add(time.ticks_ms(), wait)

    def _drop(self, reason) -> None:
        if self.connected:
            print("connection lost:", reason)
        self.mqtt.close()
        self.connected = self.registered = False
        self._backoff()

    def _publish(self, kind: str, doc: dict, qos: int) -> None:
        """Publish doc to `devices/<thermostat>/messages/events/<kind>` (data, alerts). The topic is
        built per message: kept for the run, the two cost a name's length each (docs/firmware.md, Memory)."""
        self.mqtt.publish("devices/%s/messages/events/%s" % (self.name, kind), json.dumps(doc), qos=qos,
                          props={CONTENT_TYPE: "application/json"})

    # --- control and telemetry ------------------------------------------------------------------

    def control(self) -> None:
        try:
            self.temperature = self.sensor.read()
        except OSError as e:
            print("sensor failed:", e)
            self.temperature = None
        if self.temperature is None:
            self.heater = False  # fail safe: never heat blind
        else:
            self.heater = heater_should_be_on(self.temperature, self.set_point.value,
                                              self.hysteresis, self.heater)
        self.relay.value(self.heater)
        if self.led:
            self.led.value(self.registered)
        active = alerts_for(self.temperature, self.alert_limits[0], self.alert_limits[1])
        for name in active:
            if name not in self.active_alerts:
                self._raise_alert(name)
        self.active_alerts = active

    def _raise_alert(self, name: str) -> None:
        doc = {"device": self.name, "ts_ms": hlc.wall_ms(), "alert": name,
               "temperature": self.temperature, "set_point": self.set_point.value}
        print("alert", name)
        self.pending_alerts.append(doc)
        del self.pending_alerts[:-8]  # bounded while offline: keep the newest
        self._flush_alerts()

    def _flush_alerts(self) -> None:
        while self.connected and self.pending_alerts:
            try:
                self._publish("alerts", self.pending_alerts[0], 1)
            except (OSError, mqtt5.MQTTException, MQTTProtocolError) as e:
                return self._drop(e)
            self.pending_alerts.pop(0)

    def telemetry(self) -> dict:
        """The telemetry document, updated in place: one dict for the whole run. A new one per
        message (300 bytes) landed wherever the heap had room, and a stale reference to the last one
        (the main loop's frame keeps the slot it was passed in) could keep it alive in the middle of
        the largest free block: whether 4 KB stayed in one piece depended on where it fell."""
        doc = self.doc
        doc["seq"] += 1
        self._peak()
        doc["ts_ms"] = hlc.wall_ms()
        doc["temperature"] = None if self.temperature is None else round(self.temperature, 2)
        doc["set_point"] = self.set_point.value
        doc["set_point_source"] = self.set_point.source
        doc["set_point_rejected"] = self.set_point.rejected
        doc["heater"] = self.heater
        doc["registered"] = self.registered
        doc["wifi"] = self.link.status() if self.link else None
        doc["update"] = self.update
        return doc

    # --- main loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Run forever. The loop's last-resort handler reports an unexpected exception (printed,
        and in telemetry as `faults`/`last_fault`), drops the connection (its state is unknown)
        and carries on; more than _MAX_FAULTS within _FAULT_WINDOW_MS of each other is a defect no
        retry will cure, so the device restarts (`restart`: machine.reset, or exit on unix)."""
        gc.collect()  # start mem_peak from the live heap, not from the garbage of importing
        while True:
            try:
                self._loop()
            except Exception as e:
                self._fault(e)

    def _fault(self, e) -> None:
        now = time.ticks_ms()
        run, last = self.fault_run
        if run and time.ticks_diff(now, last) > _FAULT_WINDOW_MS:
            run = 0
        self.fault_run = (run + 1, now)
        doc = self.doc
        doc["faults"] += 1
        gc.collect()  # a MemoryError leaves garbage behind; reporting it needs a little heap
        doc["last_fault"] = ("%s: %s" % (type(e).__name__, e))[:80]
        print("fault %d: %s" % (doc["faults"], doc["last_fault"]))
        sys.print_exception(e)
        if self.fault_run[0] > _MAX_FAULTS:
            print("too many faults, restarting")
            self.restart()
        try:
            self._drop(e)
        except Exception as again:
            print("fault while dropping the connection:", again)
            self.mqtt.sock = None
            self.connected = self.registered = False

    def _loop(self) -> None:
        now = time.ticks_ms()
        next_control = next_telemetry = now
        while True:
            self.watchdog.feed()
            if self.control_now or time.ticks_diff(now, next_control) >= 0:
                self.control_now = False
                self.control()
                next_control = time.ticks_add(now, self.timing["control_ms"])
            if not self.registered and time.ticks_diff(time.ticks_ms(), self.retry_at) >= 0:
                if self.connected:
                    self._try_register()
                else:
                    self._connect()
            now = time.ticks_ms()
            if time.ticks_diff(now, next_telemetry) >= 0:
                next_telemetry = time.ticks_add(now, self.timing["telemetry_ms"])
                self._peak()
                self.doc["mem_free"], self.doc["mem_largest"] = heap_headroom()
                if self.connected:
                    try:
                        self._publish("data", self.telemetry(), 0)
                    except (OSError, mqtt5.MQTTException, MQTTProtocolError) as e:
                        self._drop(e)
                    if self.registered and "fwboot" in sys.modules:  # this version is on trial (main.py's mark)
                        self.accept()  # and reached its first telemetry: it stays
            self._peak()
            gc.collect()
            now = time.ticks_ms()
            wait = min(time.ticks_diff(next_control, now), time.ticks_diff(next_telemetry, now))
            if not self.registered:
                wait = min(wait, time.ticks_diff(self.retry_at, now))
            self._idle(wait)
            now = time.ticks_ms()

    def _peak(self) -> None:
        """Telemetry's `mem_peak`: the most the heap held, as sampled around each turn's collection."""
        self.doc["mem_peak"] = max(self.doc["mem_peak"], gc.mem_alloc())

    def accept(self) -> None:
        """Tell fwboot this version passed its trial. fwboot is not loaded during the trial (its heap is
        the app's; main.py leaves None in its place as the mark): imported now, it accepts the version
        and resets the board into its accepted boot (fwboot.py says why). An update asked for during
        the trial (ota.py waits for this) is made after that boot's registration, from its GET."""
        try:
            self.mqtt.disconnect()
        except OSError:
            pass
        del sys.modules["fwboot"]
        import fwboot
        fwboot.accept()

    def _idle(self, timeout_ms: int) -> None:
        """Sleep until the next tick, but handle incoming messages (set point changes) at once."""
        timeout_ms = max(0, timeout_ms)
        if not self.connected:
            time.sleep_ms(timeout_ms)
            return
        try:
            self.mqtt.check_msg()  # keep-alive
            self.mqtt.wait_msg(timeout_ms)
            self.mqtt.check_msg()
        except (OSError, mqtt5.MQTTException, MQTTProtocolError) as e:
            self._drop(e)
