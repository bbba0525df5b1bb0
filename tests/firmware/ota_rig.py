"""A thermostat board on the MicroPython unix port that resets: for the over-the-air update tests.

`images/firmware/run_unix.py` runs `micropython -m main` in a flash directory (the bundle's .mpy files and
config.json); when it exits with status 3 (what `machine.reset()` is on a board: fwboot.reset,
board_sim.restart) it is started again in the same directory, as a board boots again. Lines of every run
are kept in one list, each run's first line preceded by `<boot N>`, so a test waits for what happens across
reboots. `power_cycle()` is a power cut.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

from images.firmware.build import firmware_defaults
from tests.device_firmware.micropython import MICROPYTHON, ROOT, LineLog
from tests.device_firmware.thermostat_rig import thermostat_config

BUILD = ROOT / "images" / "firmware" / "build.py"
RUN_UNIX = ROOT / "images" / "firmware" / "run_unix.py"


def build_variant(source: Path, out: Path, version: str, app_prefix: str = "") -> Path:
    """A bundle of the firmware under another VERSION, its app.py optionally prefixed (a broken build)."""
    variant = out / f"src-{version}"
    variant.mkdir(parents=True)
    for module in source.glob("*.py"):
        text = module.read_text()
        if module.name == "thermostat.py":
            text = re.sub(r'^VERSION = "[^"]+"', f'VERSION = "{version}"', text, count=1, flags=re.M)
        if module.name == "app.py":
            text = app_prefix + text
        (variant / module.name).write_text(text)
    proc = subprocess.run([sys.executable, str(BUILD), "--out", str(out), "--source", str(variant)],
                          capture_output=True, text=True, check=True)
    return Path(proc.stdout.strip())


class ResettingBoard(LineLog):
    """The bundle and a config on a flash directory, run by the launcher users run
    (``images/firmware/run_unix.py``): its boot loop restarts the firmware after a reset."""

    def __init__(self, flash: Path, bundle: Path, name: str, host: str, port: int, heap: str = "64K", **config):
        self.flash = flash
        flash.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(bundle) as archive:
            archive.extractall(flash)
        settings = thermostat_config(name, host, port, **config)
        if "timing" not in config:
            # The firmware's own request timeout (device_firmware/config.py), not the rig's fast 1 s: no OTA
            # test is about a request that times out, and on a busy machine the gateway's answers (and the
            # updater's reads) can take longer than 1 s, so the updater's connects timed out one after the
            # other and an update never finished within its minute (make test-busy).
            settings["timing"] = {**settings["timing"], "request_timeout_ms": firmware_defaults()["timing"]["request_timeout_ms"]}
        (flash / "config.json").write_text(json.dumps(settings))
        super().__init__()
        self.exit_status: int | None = None
        self.process = subprocess.Popen(
            [sys.executable, str(RUN_UNIX), str(flash), "--heap", heap, "--micropython", str(MICROPYTHON)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._add(line.rstrip("\n"))
        self.exit_status = self.process.wait()

    def _ended(self) -> bool:
        return self.exit_status is not None

    @property
    def boots(self) -> int:
        with self._cond:
            return sum(1 for line in self.lines if line.startswith("<boot "))

    def pointer(self) -> str | None:
        try:
            return (self.flash / "firmware.txt").read_text()
        except FileNotFoundError:
            return None

    def power_cycle(self) -> None:
        """Pull the plug (the launcher's SIGUSR1): the board boots again with its flash as the cut left it."""
        self.process.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(5)


def publish(gateway, *args: str) -> list[dict]:
    """`appliance firmware publish ...` against a gateway process; its JSON lines."""
    proc = subprocess.run([sys.executable, "-m", "appliance", "firmware", "publish", *args,
                           "--data-dir", str(gateway.data_dir), "--host", gateway.host, "--port", str(gateway.port)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]
