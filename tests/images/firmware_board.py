"""The MicroPython unix port as a board for images/firmware/deploy.py (its `Board` interface).

mpremote cannot reach a unix port, so the deploy steps run against this instead: the flash is a
directory, `reset()` stops the running `micropython -m main` and starts a new one there (so boot
stubs, SAFE_BOOT and stale files have their real effect), `implementation()` asks the real
interpreter. `ops` records what deploy did, and whether SAFE_BOOT was present at that moment.
The unix port has no RTC: setting the clock is recorded only.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path

from images.firmware.deploy import IMPLEMENTATION, SAFE_BOOT, parse_implementation
from tests.device_firmware.micropython import MICROPYTHON


class UnixPortBoard:
    def __init__(self, flash: Path, micropython, heap: str = "64K"):
        self.flash = flash
        self.flash.mkdir(parents=True, exist_ok=True)
        self.micropython = micropython  # the conftest fixture: starts processes, kills them at teardown
        self.heap = heap
        self.ops: list[tuple] = []
        self.runs: list = []  # one MicroPython process per reset

    @property
    def running(self):
        return self.runs[-1] if self.runs else None

    def _safe(self) -> bool:
        return (self.flash / SAFE_BOOT).exists()

    def implementation(self) -> dict:
        self.ops.append(("implementation",))
        out = subprocess.run([str(MICROPYTHON), "-c", IMPLEMENTATION], capture_output=True, text=True, check=True)
        return parse_implementation(out.stdout.strip())

    def files(self) -> list[str]:
        return sorted(p.name for p in self.flash.iterdir() if p.is_file())

    def put(self, local: Path, remote: str) -> None:
        self.ops.append(("put", remote, self._safe()))
        shutil.copyfile(local, self.flash / remote)

    def remove(self, remote: str) -> None:
        self.ops.append(("remove", remote, self._safe()))
        (self.flash / remote).unlink()

    def set_clock_utc(self, now: datetime.datetime) -> None:
        self.ops.append(("clock", now.tzinfo is not None and now.utcoffset() == datetime.timedelta(0)))

    def reset(self) -> None:
        self.ops.append(("reset", self._safe()))
        if self.running is not None:
            self.running.stop()
        self.runs.append(self.micropython(["-m", "main"], cwd=self.flash, path=[self.flash], heap=self.heap))
        if self._safe():
            # A board in safe mode finishes booting at its REPL, where mpremote then finds it:
            # here the interpreter exits once app.py has seen SAFE_BOOT.
            self.running.wait(10)
