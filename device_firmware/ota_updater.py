"""Over-the-air update: fetch a firmware version from the gateway, verify it, switch to it.

Runs at boot INSTEAD of the thermostat (app.py, when the request `update.pending` exists, written by
the thermostat's ota.py), so the whole heap is its own: the thermostat's code, buffers and
names are never loaded (beside them it did not fit a 64 KB heap). It connects to the gateway on its
own MQTT client with the thermostat's identity, fetches, verifies and switches, and resets the board
into the new version on trial (fwboot.py), or, refused or stalled, back into the thermostat, which
reports the outcome this writes into the update record `update.json` (and removes the request).

Meanwhile it keeps the room where the thermostat had it: the relay follows the last good set point
(the thermostat's copy in flash, `state_file`) with the same hysteresis (`control.py`), a failed
sensor turns it off, and the watchdog is fed. A set point written during the update is applied by the
thermostat right after it, from its GET at boot. Telemetry goes on (`registered: false`, `update`).

Wire (the gateway's `appliance/firmware/`): a QoS 1 request to `firmware/v1/command/chunk`, RESP3
`CHUNK <version> <file> <offset> <size>`, Response Topic `clients/<id>/services/firmware/_any_/
command/chunk/response` and Correlation Data; the reply is a RESP3 bulk string of at most `size` bytes
(shorter at the end of the file) or `-ERR <why>`. `size` is what fits our receive buffer whole (4 KB,
the gateway's cap), so a chunk is written to flash straight from that buffer (and hashed there).

Files land in `fw/a` or `fw/b`, whichever the running version is not in (the deployed one is in the
flash's root; short names, as every module's `__file__` is interned with its whole path): first `manifest.txt` (`<name> <version>
<mpy version>`, then one `<file> <size> <sha256 hex>` per line), then `manifest.sig` when the config
has a public key (`update.key`: ECDSA P-256, checked by `p256.py` over the manifest's sha256), then every
file, each checked against its sha256. The manifest's sha256, once verified, goes into the request, so
after a power cut the manifest on flash is checked against it instead of being fetched (and its
signature checked) again. A file already there is hashed and resumed at its end. When all are good the
pointer (`fwboot.py`, which also writes the `main.py` that boots it) is replaced in one rename, with
the new version on trial, and the board resets.
"""

import binascii
import gc
import hashlib
import json
import os
import sys
import time
from micropython import const

import fwboot
import resp3
from control import heap_headroom, heater_should_be_on
from mqtt5 import MQTTClient, MQTTException
from mqtt5_codec import CONTENT_TYPE, CORRELATION_DATA, RESPONSE_TOPIC, MQTTProtocolError, Oversized

REQUEST_TOPIC = "firmware/v1/command/chunk"
_RECEIVE_BUFFER = const(4352)  # a 4,096-byte chunk (the gateway's cap) with its topic and properties
_MAX_CHUNK = const(4096)
_STALL_MS = const(60000)  # no chunk for this long (gateway gone, queue always full): back to the thermostat
_FILE_NAME_CHARS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"


def _safe_name(name) -> bool:
    """A version or file name that is one path component: 1-32 of [A-Za-z0-9._-], not dot-led."""
    return 0 < len(name) <= 32 and name[0] != 46 and all(c in _FILE_NAME_CHARS for c in name)


def _remove_tree(path: str) -> None:
    try:
        entries = list(os.ilistdir(path))
    except OSError:
        return
    for entry in entries:
        child = path + "/" + entry[0]
        if entry[1] == 0x4000:
            _remove_tree(child)
        else:
            os.remove(child)
    os.rmdir(path)


def _replace(path, doc) -> None:
    """Replace a JSON file whole (a new file renamed over it: a power cut leaves one of the two)."""
    with open(path + ".new", "w") as f:
        json.dump(doc, f)
    os.rename(path + ".new", path)


def _remove(path) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _hash_file(path, hasher) -> int:
    """Feed the file at `path` to `hasher`; its size, or -1 if there is none."""
    try:
        f = open(path, "rb")
    except OSError:
        return -1
    size = 0
    buf = bytearray(512)
    with f:
        while True:
            n = f.readinto(buf)
            if not n:
                return size
            hasher.update(memoryview(buf)[:n])
            size += n


def _last_set_point(settings) -> float:
    """The set point to hold: the thermostat's copy in flash (it writes only values it validated),
    if it is a number within the config's range; else the config's default, as the thermostat does."""
    sp = settings["set_point"]
    try:
        with open(settings["state_file"]) as f:
            value = float(json.load(f)["set_point"])
        if sp["min"] <= value <= sp["max"]:
            return value
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return sp["default"]


def start(settings, sensor, relay, watchdog, restart, led=None, link=None):
    """app.py's entry, named as a word the thermostat's modules hold (a qstr app.mpy adds for nothing)."""
    return Updater(settings, sensor, relay, watchdog, restart, led, link)


class Updater:
    """The update named by the record, for the thermostat of `settings` (app.py's arguments)."""

    def __init__(self, settings, sensor, relay, watchdog, restart, led=None, link=None):
        try:
            with open("update.pending") as f:
                self.doc = json.load(f)  # {"version", "fw", and "manifest" once verified}
            self.version = self.doc["version"]
        except (OSError, ValueError, KeyError, TypeError):  # a damaged request: refused below, and removed
            self.doc, self.version = {}, None
        if not isinstance(self.version, str):
            self.version = "(unreadable request)"
        self.name = settings["thermostat"]
        self.timing = settings["timing"]
        self.key = settings["update"]["key"]
        self.sensor, self.relay, self.watchdog, self.restart, self.led, self.link = (
            sensor, relay, watchdog, restart, led, link)
        self.hysteresis = settings["hysteresis_c"]
        self.set_point = _last_set_point(settings)
        self.heater = False
        self.temperature = None
        broker = settings["broker"]
        self.mqtt = MQTTClient(self.name, broker["host"], broker["port"], broker["user"], broker["password"],
                               keepalive=broker["keepalive"], timeout_ms=self.timing["request_timeout_ms"],
                               buf_size=768, recv_size=_RECEIVE_BUFFER)
        self.mqtt.set_callback(self.on_message)
        self.resp = "clients/%s/services/firmware/_any_/command/chunk/response" % self.name
        # A reply must fit the receive buffer whole: topic, packet id, correlation data, RESP3 framing.
        self.chunk = min(_MAX_CHUNK, (_RECEIVE_BUFFER - len(self.resp) - 48) & ~63)
        # Its status has an output of its own: it is no reading (no ts_ms; the cloud keeps it apart).
        self.data_topic = "devices/%s/messages/events/update" % self.name
        self.connected = False
        self.backoff_ms = self.timing["backoff_min_ms"]
        self.retry_at = time.ticks_ms()  # next connection attempt, or next request after a refusal
        self.corr = None  # correlation data of the outstanding request
        self.sent = 0
        self.count = 0
        self.progress_at = time.ticks_ms()
        self.state, self.reason, self.file = "downloading", None, None
        self.done = 0
        self.app_listed = False
        self.dir = None  # where the files go: fw/a or fw/b (_start)
        self.outcome = None  # (state, reason) once the update is over: run() writes it and resets
        self.mem_peak = 0
        self.heap = heap_headroom()

    # --- the loop ----------------------------------------------------------------------------------

    def run(self) -> None:
        """Until the update is over: hold the room, fetch, report; then write the outcome and reset.
        An exception nothing here expected is the updater's defect: it ends the update (refused, with
        the exception as the reason) rather than leave the board outside the thermostat."""
        try:
            self._start()
            # A resumed update hashed what was on flash (buffers, file objects, hashers): that garbage goes
            # before the connection's socket and poller are allocated, or they land above it, at the top
            # of the heap, and split the largest free block (2.9-3.1 KB instead of 6 KB, measured).
            gc.collect()
            self._loop()
        except Exception as e:
            sys.print_exception(e)
            self.outcome = ("refused", "updater fault: %s: %s" % (type(e).__name__, e))
        self._end()

    def _start(self) -> None:
        print("update: fetching", self.version)
        if not _safe_name(self.version.encode()):
            self.outcome = ("refused", "not a version name (1-32 of A-Za-z0-9._-)")
            return
        pointer = fwboot.read()
        if pointer[2] is not None:  # a switch a reset cut short before main.py: the previous version runs
            pointer = [pointer[1], None, None, pointer[3], pointer[5], None]
        self.pointer = pointer
        self.dir = "fw/b" if pointer[4] == "fw/a" else "fw/a"
        if pointer[3] == self.version:
            self.outcome = ("rolled_back", "it failed its trial boot; publish another version")
            return
        try:
            os.mkdir("fw")
        except OSError:
            pass
        for entry in list(os.ilistdir("fw")):  # flash for two versions: the running one and this one
            if "fw/" + entry[0] not in (pointer[4], self.dir):
                _remove_tree("fw/" + entry[0])
        try:  # files of this version already there are kept (and checked); another version's go
            with open(self.dir + "/manifest.txt", "rb") as f:
                kept = f.readline().split()[1:2] == [self.version.encode()]
        except OSError:
            kept = False
        if not kept:
            _remove_tree(self.dir)
        try:
            os.mkdir(self.dir)
        except OSError:
            pass
        if self._resume_manifest():
            return
        self._open("manifest.txt", None, None)

    def _loop(self) -> None:
        now = time.ticks_ms()
        next_control = next_telemetry = now
        while self.outcome is None:
            self.watchdog.feed()
            if time.ticks_diff(now, next_control) >= 0:
                self._hold()
                next_control = time.ticks_add(now, self.timing["control_ms"])
            if not self.connected and time.ticks_diff(now, self.retry_at) >= 0:
                self._connect()
            if self.connected:
                self._request()
            now = time.ticks_ms()
            if time.ticks_diff(now, self.progress_at) > _STALL_MS:
                self.outcome = ("waiting", "no progress for %d s" % (_STALL_MS // 1000))
            if time.ticks_diff(now, next_telemetry) >= 0:
                next_telemetry = time.ticks_add(now, self.timing["telemetry_ms"])
                self._telemetry()
            self.mem_peak = max(self.mem_peak, gc.mem_alloc())
            gc.collect()
            now = time.ticks_ms()
            wait = max(0, min(time.ticks_diff(next_control, now), time.ticks_diff(next_telemetry, now), 100))
            try:
                if self.connected:
                    self.mqtt.check_msg()  # keep-alive
                    self.mqtt.wait_msg(wait)
                else:
                    time.sleep_ms(wait)
            except (OSError, MQTTException, MQTTProtocolError) as e:
                self._drop(e)
            now = time.ticks_ms()

    def _end(self) -> None:
        """Write the outcome into the record and reset: into the new version, or the thermostat."""
        state, why = self.outcome
        if state == "rebooting":
            print("update: %s verified (%d files), restarting" % (self.version, self.done))
        else:
            print("update: %s %s: %s" % (state, self.version, why))
            try:
                if state == "refused" and self.dir:
                    _remove_tree(self.dir)  # bad data: a retry starts from nothing
                _replace("update.json", {"state": state, "version": self.version, "file": self.file,
                                         "offset": self.offset if self.file else None, "reason": why})
            except OSError as e:  # a failing flash: the thermostat must run all the same
                print("update: cannot write the outcome:", e)
            _remove("update.pending")  # after the outcome: a reset in between runs the update again
        try:
            self.mqtt.disconnect()
        except OSError:
            pass
        self.restart()

    def _hold(self) -> None:
        """The thermostat's control, on the last good set point."""
        try:
            self.temperature = self.sensor.read()
        except OSError:
            self.temperature = None
        if self.temperature is None:
            self.heater = False  # fail safe: never heat blind
        else:
            self.heater = heater_should_be_on(self.temperature, self.set_point, self.hysteresis, self.heater)
        self.relay.value(self.heater)
        if self.led:
            self.led.value(False)

    def _telemetry(self) -> None:
        self.heap = heap_headroom()
        if not self.connected:
            return
        doc = {"device": self.name, "fw": self.doc.get("fw"), "registered": False,
               "temperature": None if self.temperature is None else round(self.temperature, 2),
               "set_point": self.set_point, "heater": self.heater,
               "mem_peak": self.mem_peak, "mem_free": self.heap[0], "mem_largest": self.heap[1],
               "update": self.status()}
        try:
            self.mqtt.publish(self.data_topic, json.dumps(doc), qos=0, props={CONTENT_TYPE: "application/json"})
        except (OSError, MQTTException, MQTTProtocolError) as e:
            self._drop(e)

    def status(self) -> dict:
        """What telemetry says about the update."""
        return {"state": self.state, "version": self.version, "file": self.file,
                "offset": self.offset if self.file else None, "reason": self.reason}

    # --- the connection ----------------------------------------------------------------------------

    def _connect(self) -> None:
        if self.link and not self.link.up():
            self.retry_at = time.ticks_add(time.ticks_ms(), 250)  # Wi-Fi keeps its own backoff: poll it
            return
        try:
            self.mqtt.connect(clean_session=True)
            self.mqtt.subscribe(self.resp, 1)
        except (OSError, MQTTException, MQTTProtocolError) as e:
            print("update: connect failed:", e)
            return self._drop(e)
        self.connected = True
        self.corr = None  # whatever was outstanding died with the old connection: ask again
        self.backoff_ms = self.timing["backoff_min_ms"]
        print("update: connected")

    def _drop(self, reason) -> None:
        if self.connected:
            print("update: connection lost:", reason)
        self.mqtt.close()
        self.connected = False
        self.retry_at = time.ticks_add(time.ticks_ms(), self.backoff_ms)
        self.backoff_ms = min(self.backoff_ms * 2, self.timing["backoff_max_ms"])

    def _request(self) -> None:
        """(Re)send the chunk request that is due: none outstanding, or its reply overdue."""
        now = time.ticks_ms()
        if self.file is None or time.ticks_diff(now, self.retry_at) < 0:
            return
        if self.corr is not None and time.ticks_diff(now, self.sent) < self.timing["request_timeout_ms"]:
            return
        self.count += 1
        self.corr = self.count.to_bytes(4, "big")
        self.sent = now
        try:
            self.mqtt.publish(REQUEST_TOPIC, resp3.encode_command("CHUNK", self.version, self.file, str(self.offset),
                                                                  str(self.chunk)),
                              qos=1, props={RESPONSE_TOPIC: self.resp, CORRELATION_DATA: self.corr})
        except MQTTException as e:  # the gateway's queue is full (0x97), or an ACL says no: later
            print("update: request refused:", e)
            self.reason = str(e)
            self.corr = None
            self.retry_at = time.ticks_add(now, self.timing["backoff_max_ms"])
        except (OSError, MQTTProtocolError) as e:
            self._drop(e)

    # --- replies (inside the MQTT callback: payload is a view into the receive buffer) ---------------

    def on_message(self, topic, payload, props) -> None:
        if self.corr is None or props.get(CORRELATION_DATA) != self.corr or topic != self.resp.encode():
            return
        self.corr = None
        self._reply(payload)

    def _reply(self, payload) -> None:
        if isinstance(payload, Oversized):  # the gateway sent more than we asked for
            self.outcome = ("waiting", "reply of %d bytes does not fit the receive buffer" % payload.size)
            return
        try:
            data = resp3.decode(payload)
        except ValueError as e:
            self.outcome = ("waiting", "gateway: %s" % e)
            return
        if isinstance(data, resp3.Resp3Error):
            if self.file == "manifest.sig":  # we have a key: an unsigned bundle is not installed
                return self._stop("the manifest is not signed (gateway: %s)" % data)
            self.outcome = ("waiting", "gateway: %s" % data)
            return
        if not isinstance(data, memoryview) or len(data) > self.chunk:
            self.outcome = ("waiting", "gateway: not a chunk")
            return
        try:
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError as e:  # the flash is full or failing: no use fetching more
            return self._stop("cannot write %s: %s" % (self.file, e))
        self.hash.update(data)
        self.offset += len(data)
        self.progress_at = time.ticks_ms()
        if len(data) < self.chunk or self.offset == self.size:
            self._finish()

    # --- files --------------------------------------------------------------------------------------

    def _stop(self, why) -> None:
        """The bundle is refused: nothing is switched, and this version is not tried again."""
        self.outcome = ("refused", why)

    def _open(self, name, size, sha) -> bool:
        """Start (or resume) one file: what is already on flash is hashed and kept if it can be.
        True if it is all there already (its check is then the caller's: no recursion per file)."""
        self.file, self.size, self.sha = name, size, sha
        self.path = "%s/%s" % (self.dir, name)
        self.hash = hashlib.sha256()
        self.offset = 0
        if size is None:  # the manifest and signature are fetched afresh
            try:
                os.remove(self.path)
            except OSError:
                pass
            return False
        have = _hash_file(self.path, self.hash)
        if have > size:
            os.remove(self.path)
            self.hash = hashlib.sha256()
        elif have > 0:
            self.offset = have
        return self.offset == size

    def _resume_manifest(self) -> bool:
        """After a reset during the download: the manifest on flash is used if it is the one verified
        before (its sha256 is in the record); True if so, and the files are under way."""
        if not self.doc.get("manifest"):
            return False
        hasher = hashlib.sha256()
        if _hash_file(self.dir + "/manifest.txt", hasher) < 0:
            return False
        if binascii.hexlify(hasher.digest()).decode() != self.doc["manifest"]:
            return False
        print("update: resuming %s with the manifest verified before" % self.version)
        self._check_manifest()
        return True

    def _finish(self) -> None:
        """The last chunk of a file arrived."""
        name = self.file
        if name == "manifest.txt":
            self.manifest = self.hash.digest()
            if self.key:
                self._open("manifest.sig", None, None)
                return
            return self._manifest_verified()
        if name == "manifest.sig":
            return self._check_signature()
        if self._complete():
            self._next_file()

    def _complete(self) -> bool:
        """The file fetched (or found) in full matches the manifest; else the update is refused."""
        if self.offset != self.size or binascii.hexlify(self.hash.digest()) != self.sha:
            self._stop("%s: sha256 does not match the manifest" % self.file)
            return False
        self.done += 1
        return True

    def _check_signature(self) -> None:
        with open(self.path, "rb") as f:
            signature = f.read(65)
        try:
            key = binascii.unhexlify(self.key)
        except ValueError as e:
            return self._stop("config update.key: %s" % e)
        gc.collect()
        import p256
        good = p256.verify(key, self.manifest, signature)
        self.mem_peak = max(self.mem_peak, gc.mem_alloc())
        del sys.modules["p256"], p256
        gc.collect()
        if not good:
            return self._stop("manifest signature does not verify")
        self._manifest_verified()

    def _manifest_verified(self) -> None:
        """Record the manifest's sha256 (a reset now resumes without fetching it again), then go on."""
        self.doc["manifest"] = binascii.hexlify(self.manifest).decode()
        _replace("update.pending", self.doc)
        self._check_manifest()

    def _check_manifest(self) -> None:
        with open(self.dir + "/manifest.txt", "rb") as f:
            head = f.readline().split()
            self.pos = f.tell()
        if len(head) != 3 or head[1] != self.version.encode():
            return self._stop("the manifest is not version %s" % self.version)
        if head[2] != str(sys.implementation._mpy & 0xFF).encode():
            return self._stop("the bundle's .mpy version %s is not this port's" % head[2].decode())
        self._next_file()

    def _next_file(self) -> None:
        """On to the manifest's next file to fetch (those already on flash are checked and passed),
        or the switch when there is none."""
        while True:
            with open(self.dir + "/manifest.txt", "rb") as f:
                f.seek(self.pos)
                line = f.readline()
                self.pos = f.tell()
            fields = line.split()
            if not fields:
                if not self.app_listed:  # a version without the module the boot imports is no version
                    return self._stop("the manifest lists no app.mpy")
                return self._switch()
            if (len(fields) != 3 or not _safe_name(fields[0]) or not fields[1].isdigit()
                    or len(fields[2]) != 64):
                return self._stop("malformed manifest line")
            self.app_listed = self.app_listed or fields[0] == b"app.mpy"
            if not self._open(fields[0].decode(), int(fields[1]), fields[2].lower()):
                return  # to be fetched
            if not self._complete():
                return

    def _switch(self) -> None:
        """Every file verified: point the boot at the new version (one rename); run() resets into it."""
        # The request is removed before the pointer names the new version, so that version never boots
        # into the updater; a reset in between boots the old one, whose thermostat (ota.py) takes the
        # record `rebooting` as an update to make again, and finds every file verified on flash.
        _replace("update.json", {"state": "rebooting", "version": self.version})
        _remove("update.pending")
        fwboot.write([self.version, self.pointer[0], 0, None, self.dir, self.pointer[4]])
        self.state, self.file = "rebooting", None
        self.outcome = ("rebooting", None)
