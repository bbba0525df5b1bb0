"""A thermostat board on the MicroPython unix port that resets: for the over-the-air update tests.

`micropython -m main` runs in a flash directory (the bundle's .mpy files and config.json); when it exits
with status 3 (what `machine.reset()` is on a board: fwboot.reset, board_sim.restart) it is started again
in the same directory, as a board boots again. Lines of every run are kept in one list, each run's first
line preceded by `<boot N>`, so a test waits for what happens across reboots. `power_cycle()` is a power cut.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

from tests.firmware.conftest import MICROPYTHON, ROOT, LineLog
from tests.firmware.thermostat_rig import thermostat_config

BUILD = ROOT / "images" / "firmware" / "build.py"
RESET_STATUS = 3


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
    def __init__(self, flash: Path, bundle: Path, name: str, host: str, port: int, heap: str = "64K", **config):
        self.flash = flash
        flash.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(bundle) as archive:
            archive.extractall(flash)
        (flash / "config.json").write_text(json.dumps(thermostat_config(name, host, port, **config)))
        super().__init__()
        self.heap = heap
        self.boots = 0
        self.exit_status: int | None = None
        self._stopped = False
        self._power_cut = False
        self.process: subprocess.Popen[str] | None = None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stopped:
            self.boots += 1
            self._add(f"<boot {self.boots}>")
            self.process = subprocess.Popen([str(MICROPYTHON), "-X", f"heapsize={self.heap}", "-m", "main"],
                                            cwd=self.flash, env={"MICROPYPATH": str(self.flash)},
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self._add(line.rstrip("\n"))
            status = self.process.wait()
            if self._power_cut:
                self._power_cut = False
                continue
            if status != RESET_STATUS:
                self.exit_status = status
                self._add(f"<exit {status}>")
                return

    def _ended(self) -> bool:
        return self.exit_status is not None

    def pointer(self) -> str | None:
        try:
            return (self.flash / "firmware.txt").read_text()
        except FileNotFoundError:
            return None

    def power_cycle(self) -> None:
        """Pull the plug (kill -9): the board boots again with its flash as the cut left it."""
        self._power_cut = True
        assert self.process is not None
        self.process.kill()

    def stop(self) -> None:
        self._stopped = True
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


def publish(gateway, *args: str) -> list[dict]:
    """`appliance firmware publish ...` against a gateway process; its JSON lines."""
    proc = subprocess.run([sys.executable, "-m", "appliance", "firmware", "publish", *args,
                           "--data-dir", str(gateway.data_dir), "--host", gateway.host, "--port", str(gateway.port)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]
