"""Over-the-air update: fetch a firmware version from the gateway, verify it, switch to it.

Imported (by `ota.start`) only while the state store says the thermostat should run another version
than its own (`<thermostat>\\desiredFirmware`) and the heap has room for it, so the steady-state heap
never holds this code or its names. The download is a state machine the main loop
drives one step per turn (`poll()`): one chunk request is outstanding at a time, and its reply is
handled in the MQTT callback like a set point notification, so set points, control and telemetry
go on between chunks.

Wire (the gateway's `appliance/firmware/`): a QoS 1 request to `firmware/v1/command/chunk`, RESP3
`CHUNK <version> <file> <offset> <size>`, Response Topic `clients/<id>/services/firmware/_any_/
command/chunk/response` and Correlation Data; the reply is a RESP3 bulk string of at most `size` bytes
(shorter at the end of the file) or `-ERR <why>`. `size` is what fits our receive buffer whole, so a
chunk is written to flash straight from that buffer (and hashed there): no copy, no allocation.

Files land in `firmware/<version>/`, beside the running version: first `manifest.txt` (`<name> <version>
<mpy version>`, then one `<file> <size> <sha256 hex>` per line), then `manifest.sig` when the config
has a public key (`update.key`: ECDSA P-256, checked by `p256.py` over the manifest's sha256), then every
file, each checked against its sha256. A file already there (an interrupted transfer, before or after
a reboot) is hashed and resumed at its end. When all are good the pointer (`fwboot.py`) is replaced
in one rename, with the new version on trial, and the board restarts into it.
"""

import binascii
import gc
import hashlib
import json
import os
import sys
import time

import fwboot
import resp3
from mqtt5 import MQTTException
from mqtt5_codec import CORRELATION_DATA, RESPONSE_TOPIC, MQTTProtocolError, Oversized

# main.py once an update is installed: fwboot picks the version (the deployed one's main.py only imports
# app, so a board that was never updated pays nothing for this). Written at the first switch.
MAIN_PY = """# Written by ota_fetch.py: fwboot picks the firmware version (firmware.txt) and rolls back one on trial.
import gc
import sys
import fwboot

if not fwboot.start():
    del sys.modules["fwboot"]
del fwboot
gc.collect()  # before the app: what fwboot left is gone, not pinned under the app's first objects
try:
    import app  # noqa: F401
except Exception as e:
    import fwboot
    fwboot.reset(e)
"""

REQUEST_TOPIC = "firmware/v1/command/chunk"
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


class Updater:
    """The update of one thermostat (`app`, the `Thermostat`) to the version its keys name."""

    def __init__(self, app):
        self.app = app
        self.version = None
        self.state = None  # downloading | refused | waiting | rolled_back | rebooting
        self.reason = None
        self.resp = "clients/%s/services/firmware/_any_/command/chunk/response" % app.mqtt.client_id
        # A reply must fit the receive buffer whole: topic, packet id, correlation data, RESP3 framing.
        self.chunk = (len(app.mqtt.framer.buf) - len(self.resp) - 48) & ~63
        self.sock = None  # the connection our reply subscription was made on
        self.corr = None  # correlation data of the outstanding request
        self.sent = 0
        self.count = 0
        self.retry_at = None
        self.name = None
        app.store.on_other = self.on_message

    # --- what the thermostat asks -----------------------------------------------------------------

    def offer(self, raw) -> bool:
        """The desired version changed (a state store value: bytes or resp3.TooLong; None when the
        thermostat runs what is wanted). False: no update any more, and this module is unloaded."""
        if raw is None:
            print("update: none wanted now")
            self.app.store.on_other = None
            del sys.modules["ota"], sys.modules["ota_fetch"]
            return False
        version = None
        if not isinstance(raw, resp3.TooLong) and _safe_name(raw):
            version = bytes(raw).decode()
        if version == self.version and version:
            return True
        self.version, self.corr, self.name = version, None, None
        if version is None:
            self._stop("refused", "not a version name (1-32 of A-Za-z0-9._-)")
            return True
        pointer = fwboot.read()
        if pointer[3] == version:
            self._stop("rolled_back", "it failed its trial boot; publish another version")
            return True
        try:
            os.mkdir("firmware")
        except OSError:
            pass
        for entry in list(os.ilistdir("firmware")):  # flash for two versions: the running one and this one
            if entry[0] not in (pointer[0], version):
                _remove_tree("firmware/" + entry[0])
        try:
            os.mkdir("firmware/" + version)
        except OSError:
            pass
        self.state, self.reason, self.done, self.app_listed = "downloading", None, 0, False
        print("update: fetching", version)
        self._open("manifest.txt", None, None)
        return True

    def status(self) -> dict:
        """What telemetry says about the update."""
        return {"state": self.state, "version": self.version, "file": self.name,
                "offset": self.offset if self.name else None, "reason": self.reason}

    def poll(self) -> None:
        """One turn of the main loop, while registered: (re)send the chunk request that is due. A
        broken connection is dropped (the thermostat reconnects and registers, then we go on)."""
        try:
            self._poll()
        except (OSError, MQTTProtocolError) as e:
            self.app._drop(e)

    def _poll(self) -> None:
        if self.state != "downloading" and self.state != "waiting":
            return
        now = time.ticks_ms()
        if self.retry_at is not None:
            if time.ticks_diff(now, self.retry_at) < 0:
                return
            self.retry_at = None
            self.state = "downloading"
            self.reason = None
        if self.corr is not None and time.ticks_diff(now, self.sent) < self.app.timing["request_timeout_ms"]:
            return
        self.count += 1
        self.corr = self.count.to_bytes(4, "big")
        self.sent = now
        mqtt = self.app.mqtt
        # OSError (the connection) goes to the thermostat, which drops it and registers again.
        try:
            if self.sock is not mqtt.sock:  # a new connection: subscriptions died with the old one
                mqtt.subscribe(self.resp, 1)
                self.sock = mqtt.sock
            mqtt.publish(REQUEST_TOPIC, resp3.encode_command("CHUNK", self.version, self.name, str(self.offset),
                                                             str(self.chunk)),
                         qos=1, props={RESPONSE_TOPIC: self.resp, CORRELATION_DATA: self.corr})
        except MQTTException as e:  # the gateway's queue is full (0x97), or an ACL says no: later
            self._wait("request refused: %s" % e)

    # --- replies (inside the MQTT callback: payload is a view into the receive buffer) ---------------

    def on_message(self, topic, payload, props) -> None:
        if self.corr is None or props.get(CORRELATION_DATA) != self.corr or topic != self.resp.encode():
            return
        self.corr = None
        try:
            self._reply(payload)
        except Exception as e:  # e.g. MemoryError: not the connection's fault, so not the thermostat's to see
            self._wait("%s: %s" % (type(e).__name__, e))

    def _reply(self, payload) -> None:
        if isinstance(payload, Oversized):  # the gateway sent more than we asked for
            return self._wait("reply of %d bytes does not fit the receive buffer" % payload.size)
        try:
            data = resp3.decode(payload)
        except ValueError as e:
            return self._wait(str(e))
        if isinstance(data, resp3.Resp3Error):
            if self.name == "manifest.sig":  # we have a key: an unsigned bundle is not installed
                return self._stop("refused", "the manifest is not signed (gateway: %s)" % data)
            return self._wait("gateway: %s" % data)
        if not isinstance(data, memoryview) or len(data) > self.chunk:
            return self._wait("not a chunk")
        try:
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError as e:  # the flash is full or failing: no use fetching more
            return self._stop("refused", "cannot write %s: %s" % (self.name, e))
        self.hash.update(data)
        self.offset += len(data)
        if len(data) < self.chunk or self.offset == self.size:
            self._finish()

    # --- internals --------------------------------------------------------------------------------

    def _wait(self, why) -> None:
        """Not the bundle's fault (a gateway error, a full queue): try again after the longest backoff."""
        print("update: waiting:", why)
        self.state, self.reason = "waiting", why
        self.retry_at = time.ticks_add(time.ticks_ms(), self.app.timing["backoff_max_ms"])

    def _stop(self, state, why) -> None:
        print("update: %s %s: %s" % (state, self.version, why))
        self.state, self.reason, self.name = state, why, None
        if state == "refused" and self.version:
            _remove_tree("firmware/" + self.version)  # bad data: a retry starts from nothing

    def _open(self, name, size, sha) -> bool:
        """Start (or resume) one file: what is already on flash is hashed and kept if it can be.
        True if it is all there already (its check is then the caller's: no recursion per file)."""
        self.name, self.size, self.sha = name, size, sha
        self.path = "firmware/%s/%s" % (self.version, name)
        self.hash = hashlib.sha256()
        self.offset = 0
        try:
            have = os.stat(self.path)[6]
        except OSError:
            have = -1
        if have >= 0 and (size is None or have > size):
            os.remove(self.path)  # the manifest and signature are always fetched afresh
        elif have > 0:
            buf = bytearray(128)
            with open(self.path, "rb") as f:
                while True:
                    n = f.readinto(buf)
                    if not n:
                        break
                    self.hash.update(memoryview(buf)[:n])
            self.offset = have
        return size is not None and self.offset == size

    def _finish(self) -> None:
        """The last chunk of a file arrived."""
        name = self.name
        if name == "manifest.txt":
            self.manifest = self.hash.digest()
            try:
                self.key = self._public_key()
            except (OSError, ValueError) as e:
                return self._stop("refused", "config update.key: %s" % e)
            if self.key:
                self._open("manifest.sig", None, None)
                return
            return self._check_manifest()
        if name == "manifest.sig":
            return self._check_signature()
        if self._complete():
            self._next_file()

    def _complete(self) -> bool:
        """The file fetched (or found) in full matches the manifest; else the update is refused."""
        if self.offset != self.size or binascii.hexlify(self.hash.digest()) != self.sha:
            self._stop("refused", "%s: sha256 does not match the manifest" % self.name)
            return False
        self.done += 1
        return True

    def _check_signature(self) -> None:
        with open(self.path, "rb") as f:
            signature = f.read(65)
        gc.collect()
        import p256
        good = p256.verify(self.key, self.manifest, signature)
        del sys.modules["p256"], p256
        gc.collect()
        if not good:
            return self._stop("refused", "manifest signature does not verify")
        self._check_manifest()

    def _public_key(self):
        """The config's `update.key` (hex of X||Y), read now: the running thermostat keeps no copy."""
        with open("config.json") as f:
            key = (json.load(f).get("update") or {}).get("key")
        return binascii.unhexlify(key) if key else None

    def _check_manifest(self) -> None:
        with open("firmware/%s/manifest.txt" % self.version, "rb") as f:
            head = f.readline().split()
            self.pos = f.tell()
        if len(head) != 3 or head[1] != self.version.encode():
            return self._stop("refused", "the manifest is not version %s" % self.version)
        if head[2] != str(sys.implementation._mpy & 0xFF).encode():
            return self._stop("refused", "the bundle's .mpy version %s is not this port's" % head[2].decode())
        self._next_file()

    def _next_file(self) -> None:
        """On to the manifest's next file to fetch (those already on flash are checked and passed),
        or the switch when there is none."""
        while True:
            with open("firmware/%s/manifest.txt" % self.version, "rb") as f:
                f.seek(self.pos)
                line = f.readline()
                self.pos = f.tell()
            fields = line.split()
            if not fields:
                if not self.app_listed:  # a version without the module the boot imports is no version
                    return self._stop("refused", "the manifest lists no app.mpy")
                return self._switch()
            if (len(fields) != 3 or not _safe_name(fields[0]) or not fields[1].isdigit()
                    or len(fields[2]) != 64):
                return self._stop("refused", "malformed manifest line")
            self.app_listed = self.app_listed or fields[0] == b"app.mpy"
            if not self._open(fields[0].decode(), int(fields[1]), fields[2].lower()):
                return  # to be fetched
            if not self._complete():
                return

    def _switch(self) -> None:
        """Every file verified: point the boot at the new version (one rename) and restart into it."""
        fwboot.write([self.version, fwboot.read()[0], 0, None])
        with open("main.new", "w") as f:  # after the pointer: until this rename the board ignores it
            f.write(MAIN_PY)
        os.rename("main.new", "main.py")
        self.state, self.name = "rebooting", None
        print("update: %s verified (%d files), restarting" % (self.version, self.done))
        try:
            self.app.mqtt.disconnect()
        except OSError:
            pass
        self.app.restart()
