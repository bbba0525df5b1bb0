"""``images/firmware/run_unix.py``, the launcher of a thermostat on the MicroPython unix port, with a real
``micropython``: the flash directory as working directory and MICROPYPATH, the boards' 64 KB heap, a
restart on exit status 3 (a board's reset), SIGUSR1 as a power cut, nothing left running after it.
The whole firmware through it: ``tests/firmware/test_ota.py`` (``ota_rig.ResettingBoard``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from testing.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
RUN_UNIX = ROOT / "images" / "firmware" / "run_unix.py"
MICROPYTHON = ROOT / ".venv" / "bin" / "micropython"

#: Boots three times: exit 3 (reset) twice, then 7; says where it runs and how big its heap is.
RESETTING_MAIN = """\
import gc, os, sys
try:
    boots = int(open("boots").read())
except OSError:
    boots = 0
open("boots", "w").write(str(boots + 1))
print("cwd", os.getcwd(), "heap", gc.mem_free() + gc.mem_alloc())
sys.exit(3 if boots < 2 else 7)
"""
#: Runs until killed.
WAITING_MAIN = """\
import time
print("up")
while True:
    time.sleep(1)
"""


def flash_with(tmp_path: Path, main: str) -> Path:
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "main.py").write_text(main)
    (flash / "config.json").write_text("{}")
    return flash


def launch(flash: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(RUN_UNIX), str(flash), "--micropython", str(MICROPYTHON), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(process: subprocess.Popen[str], wanted: str) -> list[str]:
    assert process.stdout is not None
    lines = []
    for line in process.stdout:  # blocks on the pipe; the test's timeout bounds it
        lines.append(line.rstrip("\n"))
        if lines[-1] == wanted:
            return lines
    raise AssertionError(f"no {wanted!r} in {lines}")


def firmware_pid(launcher: subprocess.Popen[str]) -> int:
    (child,) = psutil.Process(launcher.pid).children()
    return int(child.pid)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.fixture(autouse=True)
def _micropython() -> None:
    if not MICROPYTHON.exists():
        pytest.skip("no .venv/bin/micropython (make venv installs it)")


def test_a_reset_boots_again_in_the_flash_directory_within_64k(tmp_path: Path) -> None:
    flash = flash_with(tmp_path, RESETTING_MAIN)
    process = launch(flash)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 7
    lines = output.splitlines()
    assert [line for line in lines if line.startswith("<")] == ["<boot 1>", "<boot 2>", "<boot 3>", "<exit 7>"]
    heaps = [int(line.split()[-1]) for line in lines if line.startswith("cwd")]
    assert len(heaps) == 3 and all(heap <= 64 * 1024 for heap in heaps)
    assert all(f"cwd {flash}" in line for line in lines if line.startswith("cwd"))


def test_a_power_cut_boots_again_and_stopping_leaves_nothing_running(tmp_path: Path) -> None:
    flash = flash_with(tmp_path, WAITING_MAIN)
    process = launch(flash)
    try:
        read_until(process, "up")
        first = firmware_pid(process)
        process.send_signal(signal.SIGUSR1)
        read_until(process, "<boot 2>")
        read_until(process, "up")
        second = firmware_pid(process)
        assert second != first and not alive(first)
        process.terminate()
        assert process.wait(10) == 0
        assert not alive(second)
    finally:
        process.kill()


def test_a_killed_launcher_takes_the_firmware_with_it(tmp_path: Path) -> None:
    flash = flash_with(tmp_path, WAITING_MAIN)
    process = launch(flash)
    read_until(process, "up")
    pid = firmware_pid(process)
    process.kill()
    process.wait(10)
    # the kernel delivers PDEATHSIG; the child is reaped by init
    wait_until(lambda: not alive(pid), 10, "the firmware's end after its launcher's")


def test_install_puts_a_bundle_and_its_config_on_the_flash(tmp_path: Path) -> None:
    import zipfile

    bundle = tmp_path / "fw.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("app.mpy", b"M\x06")
        archive.writestr("config.template.json", "{}")
    config = tmp_path / "device.json"
    config.write_text('{"thermostat": "t-1"}')
    flash = tmp_path / "flash"
    proc = subprocess.run([sys.executable, str(RUN_UNIX), str(flash), "--install", str(bundle), "--config", str(config),
                           "--micropython", "/bin/false"], capture_output=True, text=True, timeout=60)
    assert sorted(p.name for p in flash.iterdir()) == ["app.mpy", "config.json"]
    assert proc.returncode == 1 and "<exit 1>" in proc.stdout
    missing = subprocess.run([sys.executable, str(RUN_UNIX), str(tmp_path / "empty")], capture_output=True, text=True)
    assert missing.returncode == 2 and "config.json is missing" in missing.stderr
