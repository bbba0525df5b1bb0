"""Run a thermostat on the MicroPython unix port, as a board runs it: ``python images/firmware/run_unix.py FLASH_DIR``.

FLASH_DIR is the board's flash: the bundle's ``.mpy`` files and ``config.json`` (``--install BUNDLE
--config device.json`` puts them there), and everything the firmware writes (set point, update state,
``firmware.txt`` and the version directories of over-the-air updates). The firmware runs as
``micropython -X heapsize=64K -m main`` with FLASH_DIR as its working directory and as ``MICROPYPATH``,
within the heap of the boards it is built for.

A board restarts when ``machine.reset()`` is called; on the unix port the firmware exits with status 3
instead (``fwboot.reset``, ``board_sim.restart``), and this launcher starts it again in the same flash
directory - without that loop an over-the-air update never completes (it installs, then resets into the
new version). Any other exit status ends the launcher with that status. Each boot is announced on stdout
as ``<boot N>``. SIGUSR1 is a power cut: the running interpreter is killed (no goodbye on the wire, the
flash as the cut left it) and the board boots again. SIGTERM/SIGINT stop it. The interpreter dies with
the launcher (``PR_SET_PDEATHSIG``), so a killed launcher leaves no thermostat running.

Used by people (docs/firmware.md, "Running on the unix port"), by the OTA tests (``tests/firmware/ota_rig.py``)
and by the HIL bench (``hil_tests/harness.py``), which adds the firmware's source folder with ``--path``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

#: What the firmware exits with where a board would reset (fwboot.RESET_STATUS, board_sim).
RESET_STATUS = 3
PR_SET_PDEATHSIG = 1


def default_micropython() -> str | None:
    """The ``micropython`` next to this Python (a venv's, as ``make venv`` installs it), else on PATH."""
    beside = Path(sys.executable).with_name("micropython")
    return str(beside) if beside.exists() else shutil.which("micropython")


def install(flash: Path, bundle: Path, config: Path | None) -> None:
    """Put a bundle's modules (and a device config) on the flash, as deploy.py does on a board."""
    flash.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(bundle) as archive:
        for name in archive.namelist():
            if name.endswith(".mpy"):
                (flash / name).write_bytes(archive.read(name))
    if config is not None:
        json.loads(config.read_text())  # a config the firmware cannot read is refused here, not at boot
        shutil.copyfile(config, flash / "config.json")


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the launcher goes, however it goes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Board:
    """The boot loop: one interpreter at a time, started again on a reset or a power cut."""

    def __init__(self, command: list[str], flash: Path, env: dict[str, str]) -> None:
        self.command, self.flash, self.env = command, flash, env
        self.process: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.power_cut = False

    def run(self) -> int:
        boots = 0
        while not self.stopping:
            boots += 1
            print(f"<boot {boots}>", flush=True)
            self.process = subprocess.Popen(self.command, cwd=self.flash, env=self.env, preexec_fn=_die_with_parent)
            if self.stopping:  # SIGTERM came while it was being started: its handler saw the previous one
                self.process.kill()
            status = self.process.wait()
            if self.stopping:
                return 0
            if self.power_cut:
                self.power_cut = False
                continue
            if status != RESET_STATUS:
                print(f"<exit {status}>", flush=True)
                return status if status >= 0 else 128 - status
        return 0

    def cut_power(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:  # between boots, the next boot is the reboot
            self.power_cut = True
            self.process.kill()

    def stop(self, *_: object) -> None:
        self.stopping = True
        if self.process is not None:
            self.process.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_unix.py", description=__doc__.splitlines()[0])
    parser.add_argument("flash", type=Path, help="the board's flash directory")
    parser.add_argument("--heap", default="64K", help="MicroPython heap (default 64K: the boards' budget)")
    parser.add_argument("--micropython", default=default_micropython(), help="the unix port (default: the venv's)")
    parser.add_argument("--path", action="append", default=[], type=Path,
                        help="another MICROPYPATH entry after the flash (e.g. device_firmware/ to run the sources)")
    parser.add_argument("--install", type=Path, metavar="BUNDLE", help="first put this bundle's modules on the flash")
    parser.add_argument("--config", type=Path, help="with --install: the device config to put there as config.json")
    args = parser.parse_args(argv)
    if args.micropython is None:
        parser.error("no micropython found: give --micropython (make venv installs one in .venv/bin)")
    if args.install is not None:
        install(args.flash, args.install, args.config)
    elif args.config is not None:
        parser.error("--config goes with --install")
    if not (args.flash / "config.json").exists():
        parser.error(f"{args.flash}/config.json is missing: a thermostat needs its config (see --install --config)")
    flash = args.flash.resolve()
    env = dict(os.environ, MICROPYPATH=":".join(str(p) for p in [flash, *(p.resolve() for p in args.path)]))
    board = Board([args.micropython, "-X", f"heapsize={args.heap}", "-m", "main"], flash, env)
    signal.signal(signal.SIGUSR1, board.cut_power)
    signal.signal(signal.SIGTERM, board.stop)
    signal.signal(signal.SIGINT, board.stop)
    return board.run()


if __name__ == "__main__":
    sys.exit(main())
