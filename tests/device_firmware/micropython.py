"""The real MicroPython interpreter (the unix port) as the firmware tests run it: a child process whose
printed lines (the firmware's events) are kept with their arrival times, and the paths it runs from."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRMWARE = ROOT / "device_firmware"
MP_TESTS = Path(__file__).resolve().parent / "mp"
MICROPYTHON = ROOT / ".venv" / "bin" / "micropython"


class LineLog:
    """The lines a firmware process printed (its events), with when each arrived, and a wait for one:
    shared by a single micropython run and a board that resets into new runs."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.times: list[float] = []  # time.monotonic() when each line arrived
        self._cond = threading.Condition()

    def _add(self, line: str) -> None:
        with self._cond:
            self.lines.append(line)
            self.times.append(time.monotonic())
            self._cond.notify_all()

    def _ended(self) -> bool:
        """No more lines will come (checked under the lock)."""
        raise NotImplementedError

    def expect(self, pattern: str, timeout: float = 10.0, after: int = 0) -> tuple[int, re.Match[str]]:
        """Wait for a line (index >= after) matching pattern; returns (index, match)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(after, len(self.lines)):
                    match = regex.search(self.lines[i])
                    if match:
                        return i, match
                left = deadline - time.monotonic()
                if left <= 0 or self._ended():
                    raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines))
                self._cond.wait(left)

    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)


class MicroPython(LineLog):
    """A micropython child process whose stdout lines tests wait on (the firmware's events)."""

    def __init__(self, args: list[str], cwd: Path, micropypath: list[Path], heap: str | None = None):
        env = dict(os.environ, MICROPYPATH=":".join(str(p) for p in micropypath))
        cmd = [str(MICROPYTHON)] + (["-X", f"heapsize={heap}"] if heap else []) + args
        super().__init__()
        self.process = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._add(line.rstrip("\n"))
        self._add("<exit>")

    def _ended(self) -> bool:
        return bool(self.lines) and self.lines[-1] == "<exit>"

    def wait(self, timeout: float = 30.0) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
