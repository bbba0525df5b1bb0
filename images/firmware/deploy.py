"""Deploy a firmware bundle to a thermostat board with mpremote, and check that it came up.

A field engineer runs one command and gets "deployed" or the reason it is not. In order:

1. the config is validated (name, gateway host and port, Wi-Fi for a board, timing): every problem is
   listed at once, and the template's `<...>` placeholders are refused;
2. the bundle is verified (every file against the manifest's sha256);
3. the board's `sys.implementation` is read, and a bundle whose `.mpy` version it cannot load is
   refused before anything is written;
4. the app is stopped safely: `SAFE_BOOT` is written and the board reset, so it comes back without
   starting the thermostat or arming its watchdog (a WDT cannot be disarmed: a copy over a merely
   interrupted app would be cut short by a reset);
5. stale files are removed: a `.py` that would shadow a bundled `.mpy`, and modules of earlier
   versions that are not in this bundle;
6. the modules, the config, `boot.py` and `main.py` are copied, the RTC is set in UTC;
7. `SAFE_BOOT` is removed, the board reset, and deploy waits for the thermostat's first telemetry
   through the gateway, reporting its version and whether it registered, or why it did not come.

The board is behind `Board` (six operations); `MpremoteBoard` is the real one. The tests drive the
same steps against the MicroPython unix port as a board (tests/images/firmware_board.py), which has
no serial port for mpremote.

Usage: python images/firmware/deploy.py BUNDLE.zip --port /dev/ttyUSB0 --config device.json
       [--gateway HOST:PORT] [--user NAME --password-file FILE] [--cafile CA.pem] [--wait SECONDS] [--dry-run]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Protocol

# Written as main.py: boards autostart main.py (never main.mpy). The same lines as device_firmware/main.py:
# an over-the-air update's fwboot.py rewrites it for the version that boots (and back to this form).
MAIN_PY = (Path(__file__).resolve().parents[2] / "device_firmware" / "main.py").read_text()
BOOT_PY = ("# Written by deploy.py: boards run boot.py before main.py. No open access point in the field;\n"
           "# station mode is the thermostat's (wifi.py), which reports its status in telemetry.\n"
           "import network\nnetwork.WLAN(network.AP_IF).active(False)\n")
SAFE_BOOT = "SAFE_BOOT"
KEPT = {"boot.py", "main.py", "config.json"}  # rewritten by deploy, never removed as stale
# fwboot's: which over-the-air update boots, and the main.py of a trial's next boot; a deploy boots what it
# copied (the update directories fw/a, fw/b stay until the next update reuses them)
POINTER = ("firmware.txt", "main.py.trial")
# An over-the-air update asked for (boots into the updater instead of the thermostat) and the record of
# the last one: the deployed version starts with neither.
UPDATE_FILES = ("update.pending", "update.json")
# The thermostat's name: MQTT client id and key prefix, so no topic wildcards or '/'. At most NAME_MAX
# characters: the name is in strings the firmware keeps for the run, and its heap figures (16 KB free
# after registration on a 64 KB heap, docs/firmware.md, Memory) are measured with names this long.
NAME_MAX = 64
NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{NAME_MAX}}}")


class DeployError(Exception):
    pass


# --- checks without a board -------------------------------------------------------------------------

def _placeholder(value) -> bool:
    return isinstance(value, str) and value.startswith("<") and value.endswith(">")


def config_errors(config: dict) -> list[str]:
    """Every problem of a device config, as `field: what is wrong`; empty when it is deployable."""
    errors = []
    name = config.get("thermostat")
    if not isinstance(name, str) or not name or _placeholder(name):
        errors.append("thermostat: set this device's name (see the bundle's config template)")
    elif not NAME.fullmatch(name):
        errors.append(f"thermostat: {name!r} must be 1-64 of A-Z a-z 0-9 . _ - (it is an MQTT client id)")
    broker = config.get("broker") or {}
    host = broker.get("host")
    if not isinstance(host, str) or not host or _placeholder(host) or " " in host:
        errors.append("broker.host: set the gateway's address")
    port = broker.get("port", 1883)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        errors.append(f"broker.port: {port!r} is not a TCP port")
    hardware = config.get("hardware") or {}
    wifi = config.get("wifi") or {}
    if hardware.get("kind", "simulated") == "board":
        ssid, password = wifi.get("ssid"), wifi.get("password")
        if not isinstance(ssid, str) or not ssid or _placeholder(ssid) or len(ssid.encode()) > 32:
            errors.append("wifi.ssid: set the Wi-Fi network name (1-32 bytes)")
        if _placeholder(password) or not (password in (None, "") or
                                          (isinstance(password, str) and 8 <= len(password) <= 63)):
            errors.append("wifi.password: WPA2 wants 8-63 characters (null or \"\" for an open network)")
        for pin in ("sensor_pin", "relay_pin"):
            if not isinstance(hardware.get(pin), (int, str)):
                errors.append(f"hardware.{pin}: set the pin (see the wiring table in docs/firmware.md)")
        timeout = (config.get("timing") or {}).get("request_timeout_ms", 5000)
        watchdog = hardware.get("watchdog_ms", 30000)
        if isinstance(timeout, int) and isinstance(watchdog, int) and watchdog <= 4 * timeout:
            errors.append(f"hardware.watchdog_ms: {watchdog} must exceed 4 x timing.request_timeout_ms ({timeout}),"
                          " the longest blocking step")
    return errors


def read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DeployError(f"{path}: unreadable config ({exc})") from exc
    if not isinstance(config, dict):
        raise DeployError(f"{path}: the config must be a JSON object")
    errors = config_errors(config)
    if errors:
        raise DeployError(f"{path}: not deployable:\n  " + "\n  ".join(errors))
    return config


def read_bundle(bundle: Path, into: Path) -> dict:
    """Extract and verify; returns the manifest."""
    try:
        with zipfile.ZipFile(bundle) as archive:
            manifest = json.loads(archive.read("manifest.json"))
            for entry in manifest["files"]:
                data = archive.read(entry["path"])
                if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise DeployError(f"{entry['path']}: sha256 does not match the manifest")
                (into / entry["path"]).write_bytes(data)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise DeployError(f"{bundle}: not a valid firmware bundle ({exc})") from exc
    return manifest


def check_compatible(manifest: dict, implementation: dict | None) -> None:
    """The board loads .mpy files of bytecode version `_mpy & 0xff` (bytecode-only files carry no
    architecture, so that is the whole test). None: a dry run, no board to ask."""
    if implementation is None:
        return
    wanted = manifest["mpy_version"]
    loads = implementation.get("mpy")
    if loads is None:
        raise DeployError(f"the board's MicroPython ({implementation.get('version')}) reports no .mpy version:"
                          " it cannot load a bundle")
    if loads & 0xFF != wanted:
        raise DeployError(f"the board's MicroPython {implementation.get('version')} loads .mpy version {loads & 0xFF},"
                          f" the bundle is version {wanted}: flash a MicroPython that matches the bundle's"
                          f" mpy-cross ({manifest.get('mpy_cross', '?')})")


def stale_files(on_board: list[str], bundle_modules: set[str]) -> list[str]:
    """Module files to remove: a .py that shadows a bundled .mpy (a .py is found first), and .py/.mpy
    modules of an earlier version that this bundle no longer has. Data files are left alone."""
    stale = []
    for name in on_board:
        stem, dot, ext = name.rpartition(".")
        if not dot or name in KEPT or ext not in ("py", "mpy"):
            continue
        if ext == "py" or name not in bundle_modules:
            stale.append(name)
    return sorted(stale)


# --- the board ---------------------------------------------------------------------------------------

class Board(Protocol):
    def implementation(self) -> dict | None: ...  # {"name", "version", "mpy"}; None in a dry run
    def files(self) -> list[str]: ...  # names in the root of the flash
    def put(self, local: Path, remote: str) -> None: ...
    def remove(self, remote: str) -> None: ...
    def set_clock_utc(self, now: datetime.datetime) -> None: ...
    def reset(self) -> None: ...


IMPLEMENTATION = ("import sys; i = sys.implementation;"
                  " print('%s %s %s' % (i.name, '.'.join(str(v) for v in i.version[:3]), getattr(i, '_mpy', None)))")


def parse_implementation(line: str) -> dict:
    name, version, mpy = line.split()
    return {"name": name, "version": version, "mpy": None if mpy == "None" else int(mpy)}


class MpremoteBoard:
    """A board on a serial port, through mpremote (one command per operation). dry_run prints them."""

    def __init__(self, port: str, dry_run: bool = False):
        self.port = port
        self.dry_run = dry_run
        self.mpremote = shutil.which("mpremote") or str(Path(sys.executable).with_name("mpremote"))

    def _run(self, *args: str) -> str:
        command = ["mpremote", "connect", self.port, *args]
        print(shlex.join(command))
        if self.dry_run:
            return ""
        proc = subprocess.run([self.mpremote, *command[1:]], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise DeployError(f"failed: {shlex.join(command)}\n{proc.stderr.strip()}")
        return proc.stdout

    def implementation(self) -> dict | None:
        out = self._run("exec", IMPLEMENTATION)
        return None if self.dry_run else parse_implementation(out.strip().splitlines()[-1])

    def files(self) -> list[str]:
        out = self._run("fs", "ls", ":")
        return [line.split()[-1] for line in out.splitlines()[1:] if line.strip() and not line.endswith("/")]

    def put(self, local: Path, remote: str) -> None:
        self._run("fs", "cp", str(local), f":{remote}")

    def remove(self, remote: str) -> None:
        self._run("fs", "rm", f":{remote}")

    def set_clock_utc(self, now: datetime.datetime) -> None:
        # Not `mpremote rtc --set`: that writes this machine's local time; the thermostat's clock is UTC.
        fields = (now.year, now.month, now.day, now.weekday(), now.hour, now.minute, now.second, 0)
        self._run("exec", f"import machine; machine.RTC().datetime({fields!r})")

    def reset(self) -> None:
        self._run("reset")


# --- after the reset ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GatewayLogin:
    """How deploy logs in to the gateway to watch the telemetry: by default with the device's own account
    (its config's ``broker.user`` and ``password``), as the shipped image allows no anonymous client;
    ``cafile`` for a gateway whose listener is TLS."""

    user: str | None = None
    password: str | None = None
    cafile: Path | None = None


def wait_for_telemetry(host: str, port: int, name: str, timeout: float, login: GatewayLogin | None = None) -> dict:
    """The thermostat's first telemetry in which it is registered, through the gateway's broker.

    A refused login or subscription ends the wait at once with the gateway's reason: waiting out the
    timeout and then blaming the device would send the field engineer to the wrong end of the link."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    login = login or GatewayLogin()
    topic = f"devices/{name}/messages/events/data"
    seen: list[dict] = []
    refused: list[str] = []
    done = threading.Event()

    def on_connect(client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            refused.append(f"refused the login as {login.user or 'an anonymous client'}: {reason_code}")
            done.set()
        else:
            client.subscribe(topic, 0)

    def on_subscribe(client, userdata, mid, reason_codes, properties) -> None:
        failures = [str(code) for code in reason_codes if code.is_failure]
        if failures:
            refused.append(f"refused {login.user or 'an anonymous client'} the subscription to {topic}: {failures[0]}")
            done.set()

    def on_message(client, userdata, message) -> None:
        try:
            data = json.loads(message.payload)
        except ValueError:
            return
        seen.append(data)
        if data.get("registered"):
            done.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"deploy-{name}", protocol=mqtt.MQTTv5)
    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    if login.user is not None:
        client.username_pw_set(login.user, login.password)
    if login.cafile is not None:
        client.tls_set(ca_certs=str(login.cafile))
    try:
        client.connect(host, port)
    except (OSError, ValueError) as exc:
        raise DeployError(f"cannot reach the gateway at {host}:{port} to watch for telemetry ({exc})") from exc
    client.loop_start()
    try:
        done.wait(timeout)
    finally:
        client.loop_stop()
        client.disconnect()
    if refused:
        raise DeployError(f"the gateway at {host}:{port} {refused[0]} (give --user and --password-file of an account"
                          f" that may read {topic})")
    if done.is_set():
        return next(d for d in seen if d.get("registered"))
    if seen:
        last = seen[-1]
        raise DeployError(f"{name} sends telemetry but has not registered with the state store in {timeout:.0f} s:"
                          f" set_point_rejected={last.get('set_point_rejected')}, last_fault={last.get('last_fault')}")
    raise DeployError(f"no telemetry from {name} through {host}:{port} within {timeout:.0f} s: check its serial log"
                      " (mpremote connect PORT repl), the Wi-Fi settings and the gateway address in its config")


# --- the procedure -------------------------------------------------------------------------------------

def install(board: Board, manifest: dict, staged: Path, config_path: Path,
            now: datetime.datetime | None = None) -> None:
    """Steps 3-7 up to the last reset: check, stop safely, clean, copy, clock, restart."""
    check_compatible(manifest, board.implementation())
    (staged / SAFE_BOOT).write_text("")
    board.put(staged / SAFE_BOOT, SAFE_BOOT)
    board.reset()  # comes back in safe mode: no app, no watchdog
    modules = {e["path"] for e in manifest["files"] if e["path"].endswith(".mpy") and e["path"] != "main.mpy"}
    on_board = board.files()
    for name in stale_files(on_board, modules) + [n for n in (*POINTER, *UPDATE_FILES) if n in on_board]:
        board.remove(name)
    for name in sorted(modules):
        board.put(staged / name, name)
    board.put(config_path, "config.json")
    (staged / "boot.py").write_text(BOOT_PY)
    (staged / "main.py").write_text(MAIN_PY)
    board.put(staged / "boot.py", "boot.py")
    board.put(staged / "main.py", "main.py")
    board.set_clock_utc(now or datetime.datetime.now(datetime.UTC))
    board.remove(SAFE_BOOT)  # last: until here, a reset (or a power cut) comes back in safe mode
    board.reset()


def deploy(bundle: Path, board: Board, config_path: Path, gateway: tuple[str, int] | None,
           wait_s: float, login: GatewayLogin | None = None) -> str:
    config = read_config(config_path)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        manifest = read_bundle(bundle, staged)
        print(f"# {manifest['name']} {manifest['version']} (mpy v{manifest['mpy_version']})")
        install(board, manifest, staged, config_path)
    if wait_s <= 0:
        return f"{config['thermostat']}: {manifest['version']} installed (not waiting for telemetry)"
    broker = config.get("broker") or {}
    host, port = gateway or (broker["host"], broker.get("port", 1883))
    if login is None or login.user is None:
        login = GatewayLogin(broker.get("user"), broker.get("password"), login.cafile if login else None)
    data = wait_for_telemetry(host, port, config["thermostat"], wait_s, login)
    if data.get("fw") != manifest["version"]:
        raise DeployError(f"{config['thermostat']} runs {data.get('fw')}, not {manifest['version']}")
    return (f"{config['thermostat']}: {manifest['version']} running and registered"
            f" (set point {data.get('set_point')}, heap free {data.get('mem_free')} B)")


def parse_gateway(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError("HOST:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--port", required=True, help="serial port of the board, e.g. /dev/ttyUSB0")
    parser.add_argument("--config", type=Path, required=True, help="this device's config (from the template)")
    parser.add_argument("--gateway", type=parse_gateway, help="HOST:PORT to watch telemetry on, if this machine"
                        " reaches the gateway by another address than the device does")
    parser.add_argument("--wait", type=float, default=90, help="seconds to wait for the first telemetry (0: don't)")
    parser.add_argument("--user", help="the account deploy watches the telemetry with (default: the device's own)")
    parser.add_argument("--password-file", type=Path, help="a file whose first line is --user's password")
    parser.add_argument("--cafile", type=Path, help="CA certificate of the gateway's TLS listener")
    parser.add_argument("--dry-run", action="store_true", help="validate, verify and print the mpremote commands only")
    args = parser.parse_args(argv)
    if args.password_file is not None and args.user is None:
        parser.error("--password-file needs --user")
    password = None
    if args.password_file is not None:
        try:
            password = (args.password_file.read_text().splitlines() or [""])[0]
        except (OSError, UnicodeDecodeError) as exc:
            parser.error(f"--password-file: cannot read {args.password_file} ({exc})")
    login = GatewayLogin(args.user, password, args.cafile)
    board = MpremoteBoard(args.port, dry_run=args.dry_run)
    try:
        print(deploy(args.bundle, board, args.config, args.gateway, 0 if args.dry_run else args.wait, login))
    except DeployError as exc:
        print(f"deploy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
