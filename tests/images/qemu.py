"""The arm64 disk image booted under ``qemu-system-aarch64 -M virt`` (TCG), for ``tests/images/test_qemu_boot.py``.

The image is the one ``make image`` wrote to ``dist/``, decompressed (sparse) into a scratch directory:
the test boots that copy, so the flashable file is never written. What a technician would do with a laptop
is done to the copy's FAT boot partition with mtools (no mount, no loop device): provisioning files put
there before the first boot, read back after it.

Boot: as on the Pi, U-Boot runs the image's A/B boot script (``boot.scr`` on the FAT partition): on
the virt machine QEMU starts ``u-boot-qemu``'s build as its firmware (``-bios``) instead of the Pi's
firmware starting ``u-boot-rpi``'s. The script picks a slot, counts the attempt in ``gw-boot.env`` and
loads that slot's kernel and initramfs; everything after is the image's own.

Network: QEMU's user networking with ``hostfwd`` from host loopback ports to the guest's 1883 (MQTT and
the state store), so the test's clients connect to a host port; the guest reaches nothing else.

Test channel: the image has no login for a test to use, so the test adds one unit to the copy's slot A
(``debugfs -w`` on the partition at its offset, no mount), enabled: a root shell on the virtio console
``hvc0``, which QEMU connects to a Unix socket. Nothing else of the image is changed. (A bundle the test
installs carries the same unit, added the same way to its root file system.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from testing.processes import free_port
from tests.images.gateway_checks import PROJECT, round_trip, write_provisioning

SECTOR = 512
#: An emulated boot on a loaded 2-core machine: 40-60 s quiet, 6 min at load 15, over 15 min at load 28 (QEMU
#: at nice 19 beside other sessions' suites).
BOOT_TIMEOUT_S = 1800.0
#: Boot-to-ready and update times of the QEMU tests, for images/gateway/README.md.
TIMINGS = PROJECT / "build/qemu-timings.txt"
UBOOT = Path("/usr/lib/u-boot/qemu_arm64/u-boot.bin")
#: The shell the test drives, on the virtio console only the test's QEMU has.
TEST_SHELL_UNIT = """\
[Unit]
Description=Root shell on hvc0 for the image test (added by tests/images/qemu.py, not in the image)
# No dependency on dev-hvc0.device: on a loaded machine it can take longer than a device job's timeout.
# Until it exists, opening TTYPath fails and the unit starts again.
StartLimitIntervalSec=0

[Service]
ExecStart=/bin/bash --noprofile --norc --noediting
StandardInput=tty-force
StandardOutput=tty
StandardError=tty
TTYPath=/dev/hvc0
TTYReset=yes
Restart=always
RestartSec=2
# An interactive bash ignores SIGTERM: stopping the unit would wait out the 90 s stop timeout at every
# reboot and poweroff. It exits on SIGHUP, as on a terminal hang-up.
KillSignal=SIGHUP
"""
TEST_SHELL_NAME = "image-test-shell.service"
#: The gateway's start under emulation: the shipped unit gives it 90 s from exec to READY=1 (seconds on a Pi).
#: Under TCG on an overloaded host (load 28 on 2 cores, QEMU at nice 19) the Python start alone took longer:
#: systemd killed it at 90 s and started it again, every time, and the boot never got a READY gateway. The
#: test gives the start more time in a drop-in of its own, like its shell not part of the image.
EMULATED_START_DROP_IN = ("appliance.service.d", "emulated-start.conf", """\
[Service]
# Added by tests/images/qemu.py: an emulated, starved machine starts the gateway in minutes, not seconds.
TimeoutStartSec=20min
""")
#: The cellular profile a field engineer puts on the boot partition (docs/hardware.md, "Setting the APN").
CELLULAR_APN, CELLULAR_PIN = "internet.example", "1234"
CELLULAR_PROFILE = f"""\
[connection]
id=cellular
type=gsm
autoconnect=true

[gsm]
apn={CELLULAR_APN}
pin={CELLULAR_PIN}

[ipv4]
method=auto
"""
#: Readline's bracketed-paste switches, in case a shell runs with line editing after all.
BRACKETED_PASTE = re.compile(r"\x1b\[\?2004[hl]")


@dataclass(frozen=True)
class Partition:
    start: int  # bytes
    size: int  # bytes


def partitions(disk: Path) -> list[Partition]:
    table = json.loads(subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True, text=True).stdout)
    return [Partition(entry["start"] * SECTOR, entry["size"] * SECTOR) for entry in table["partitiontable"]["partitions"]]


def boot_files(disk: Path, boot: Partition) -> list[str]:
    listing = subprocess.run(["mdir", "-b", "-i", f"{disk}@@{boot.start}", "::"], check=True, capture_output=True, text=True).stdout
    return sorted(line.rsplit("/", 1)[-1] for line in listing.split())


def copy_from_boot(disk: Path, boot: Partition, name: str, dest: Path) -> None:
    subprocess.run(["mcopy", "-n", "-i", f"{disk}@@{boot.start}", f"::{name}", str(dest)], check=True)


def copy_to_boot(disk: Path, boot: Partition, source: Path) -> None:
    subprocess.run(["mcopy", "-o", "-i", f"{disk}@@{boot.start}", str(source), f"::{source.name}"], check=True)


def debugfs(file_system: str, commands: str, scratch: Path) -> None:
    """``commands`` run by ``debugfs -w`` on ``file_system`` (a file, or ``disk?offset=N``)."""
    script = scratch / "debugfs.cmd"
    script.write_text(commands)
    result = subprocess.run(["debugfs", "-w", "-f", str(script), file_system], check=True, capture_output=True, text=True)
    if "rror" in result.stderr or "not found" in result.stderr:
        raise RuntimeError(f"debugfs: {result.stderr}")


def add_test_shell(file_system: str, scratch: Path, extra_units: dict[str, str] | None = None) -> None:
    """The test's shell unit (and ``extra_units``: name to text), written into a clean root file system
    with debugfs and enabled for multi-user.target, and the gateway's longer start (``EMULATED_START_DROP_IN``)."""
    units = {TEST_SHELL_NAME: TEST_SHELL_UNIT, **(extra_units or {})}
    commands = ""
    for name, text in units.items():
        (scratch / name).write_text(text)
        commands += f"cd /etc/systemd/system\nwrite {scratch / name} {name}\n"
    directory, name, text = EMULATED_START_DROP_IN
    (scratch / name).write_text(text)
    commands += f"cd /etc/systemd/system\nmkdir {directory}\ncd {directory}\nwrite {scratch / name} {name}\n"
    commands += f"cd /etc/systemd/system/multi-user.target.wants\nsymlink {TEST_SHELL_NAME} /etc/systemd/system/{TEST_SHELL_NAME}\n"
    debugfs(file_system, commands, scratch)


def image_under_test() -> Path | None:
    """``$GATEWAY_IMAGE``, or the newest ``dist/gateway-*-arm64.img.zst`` (``make image``)."""
    given = os.environ.get("GATEWAY_IMAGE")
    if given:
        return Path(given)
    built = sorted((PROJECT / "dist").glob("gateway-*-arm64.img.zst"), key=lambda path: path.stat().st_mtime)
    return built[-1] if built else None


def prerequisites_missing() -> str | None:
    for tool in ("qemu-system-aarch64", "zstd", "mcopy", "debugfs", "sfdisk"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test-image-slow installs it)"
    if not UBOOT.exists():
        return f"no {UBOOT} (u-boot-qemu; make test-image-slow installs it)"
    if image_under_test() is None:
        return "no dist/gateway-*-arm64.img.zst (make test-image-slow builds it with make image)"
    return None


def provisioned_machine(work: Path, gateway_id: str) -> VirtMachine:
    """The image under test copied into ``work`` with the test's shell, provisioned for its first boot
    (``VirtMachine.provision``); skips the test if QEMU, its tools or an image are missing."""
    missing = prerequisites_missing()
    if missing:
        pytest.skip(missing)
    image = image_under_test()
    assert image is not None
    machine = VirtMachine.from_image(image, work)
    machine.provision(gateway_id)
    return machine


class VirtMachine:
    """One disk image, booted and cut as often as a test likes; the disk keeps what the guest wrote."""

    def __init__(self, disk: Path, work: Path) -> None:
        self.disk = disk
        self.work = work
        self.process: subprocess.Popen[bytes] | None = None
        self.mqtt_port = 0
        self.console = work / "console.log"
        self.shell_path = work / "shell.sock"
        self.shell: socket.socket | None = None
        #: More raw disks for the guest (``/dev/vdb``, ...), read-only.
        self.extra_drives: list[Path] = []

    @classmethod
    def from_image(cls, image: Path, work: Path) -> VirtMachine:
        """Copy ``image`` (``.img.zst`` as ``make image`` writes it, or a plain ``.img``) into ``work`` and add
        the test's shell to its slot A."""
        disk = work / "disk.img"
        if image.suffix == ".zst":
            subprocess.run(["zstd", "-q", "-d", "-f", "--sparse", str(image), "-o", str(disk)], check=True)
        else:
            subprocess.run(["cp", "--sparse=always", str(image), str(disk)], check=True)
        add_test_shell(f"{disk}?offset={partitions(disk)[1].start}", work)
        return cls(disk, work)

    @property
    def boot_partition(self) -> Partition:
        return partitions(self.disk)[0]

    def provision(self, gateway_id: str) -> None:
        """What the technician puts on the FAT partition before the first boot: ``appliance.toml`` and
        ``appliance-passwd`` (``gateway_checks.write_provisioning``), and the cellular profile."""
        profile = self.work / "provisioning/cellular.nmconnection"
        for path in write_provisioning(profile.parent, gateway_id):
            copy_to_boot(self.disk, self.boot_partition, path)
        profile.write_text(CELLULAR_PROFILE)
        copy_to_boot(self.disk, self.boot_partition, profile)

    def cellular_profile(self) -> tuple[str, str]:
        """NetworkManager's view of the provisioned profile: its APN and (a secret) its SIM PIN."""
        shown = self.run("nmcli --show-secrets --get-values gsm.apn,gsm.pin connection show cellular").stdout.split()
        return (shown[0], shown[1]) if len(shown) == 2 else ("", "")

    def command(self) -> list[str]:
        return [
            "qemu-system-aarch64", "-M", "virt", "-cpu", "max", "-accel", "tcg,thread=multi", "-m", "1024", "-smp", "2",
            "-bios", str(UBOOT),
            "-drive", f"if=virtio,file={self.disk},format=raw,cache=writeback",
            *(option for drive in self.extra_drives for option in ("-drive", f"if=virtio,file={drive},format=raw,readonly=on")),
            "-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{self.mqtt_port}-:1883",
            "-device", "virtio-net-pci,netdev=net0,romfile=",
            "-device", "virtio-serial-pci", "-chardev", f"socket,id=shell,path={self.shell_path},server=on,wait=off",
            "-device", "virtconsole,chardev=shell",
            "-chardev", f"file,id=console,path={self.console},append=on", "-serial", "chardev:console",
            "-display", "none", "-monitor", "none",
        ]

    def start(self) -> float:
        """Start QEMU; returns ``time.monotonic()`` at the start (boot times are measured from it)."""
        self.mqtt_port = free_port()
        self.shell_path.unlink(missing_ok=True)
        started = time.monotonic()
        with (self.work / "qemu.log").open("ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return started

    def wait_for_mqtt(self, deadline: float) -> None:
        """Until a QoS 1 round trip with the provisioned account succeeds through the forwarded port."""
        while True:
            try:
                if round_trip(self.mqtt_port, "boot/ready", b"ready", timeout=5):
                    return
            except (OSError, ConnectionError):
                pass
            self._check_running()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gateway never answered MQTT:\n{self.console_text()[-3000:]}")
            time.sleep(1)

    def wait_for_unit_done(self, unit: str, timeout: float) -> str:
        """Until the oneshot ``unit`` (``RemainAfterExit=yes``) has finished: ``active`` or ``failed``,
        which it returns. A unit still running (the health check) must not race what the test does next."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.run(f"systemctl show {unit} --property=ActiveState --value").stdout.strip()
            if state in ("active", "failed"):
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"{unit} still {state} after {timeout} s")
            time.sleep(2)

    def console_text(self) -> str:
        return self.console.read_text(errors="replace") if self.console.exists() else ""

    def booted_slots(self) -> list[str]:
        """The slots the boot script chose, one per boot since the machine was made, from the console."""
        return re.findall(r"gateway: booting slot ([AB])", self.console_text())

    def wait_for_shell(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_running()
            with contextlib.suppress(OSError):
                self.shell = socket.socket(socket.AF_UNIX)
                self.shell.connect(str(self.shell_path))
                break
            if time.monotonic() > deadline:
                raise TimeoutError("QEMU's shell socket did not appear")
            time.sleep(0.5)
        while True:
            try:
                if self.run("true", timeout=5).returncode == 0:
                    return
            except TimeoutError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no shell in the guest after {timeout} s:\n{self.console_text()[-3000:]}")

    def run(self, command: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """``command`` in the guest's root shell; its output (stdout and stderr) and exit status."""
        assert self.shell is not None
        token = time.monotonic_ns()
        # Markers the shell prints but whose echoed command line does not contain ($((...)) expands): what
        # lies between them is the command's output, whatever a previous prompt or echo left before it.
        line = f"stty -echo 2>/dev/null; PS1= PS2=; echo __start_$((1+{token})); {{ {command} ; }} 2>&1; echo __done_$((2+{token}))_$?\n"
        self.shell.sendall(line.encode())
        received = b""
        deadline = time.monotonic() + timeout
        start, done = str(1 + token).encode(), str(2 + token).encode()
        pattern = re.compile(rb"__start_" + start + rb"\r?\n(.*)__done_" + done + rb"_(\d+)", re.DOTALL)
        while not (match := pattern.search(received)):
            self._check_running()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{command!r}: no end after {timeout} s: {received[-500:]!r}")
            self.shell.settimeout(min(left, 1.0))
            with contextlib.suppress(TimeoutError):
                chunk = self.shell.recv(65536)
                if not chunk:
                    raise ConnectionError("the guest's shell socket closed")
                received += chunk
        output = match.group(1).decode(errors="replace").replace("\r\n", "\n")
        output = BRACKETED_PASTE.sub("", output).replace("\r", "")
        return subprocess.CompletedProcess(command, int(match.group(2)), output, "")

    def _check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"QEMU exited with {self.process.returncode}:\n{self.console_text()[-3000:]}")
        if "Reached target emergency.target" in self.console_text()[-20000:]:
            raise RuntimeError(f"the guest is in emergency mode:\n{self.console_text()[-5000:]}")

    def power_cut(self) -> None:
        """SIGKILL to QEMU: the guest gets no chance to flush or unmount."""
        self._close_shell()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def shutdown(self, timeout: float = 180.0) -> None:
        """A clean poweroff from inside; QEMU exits when the guest powers off."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(OSError, TimeoutError, ConnectionError, RuntimeError):
            assert self.shell is not None
            self.shell.sendall(b"systemctl poweroff\n")
        self._close_shell()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.power_cut()

    def _close_shell(self) -> None:
        if self.shell is not None:
            self.shell.close()
            self.shell = None

    def __del__(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
