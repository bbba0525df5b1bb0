"""A/B updates of the arm64 image under QEMU (TCG): ``make test-image-slow``.

One machine, one disk, the scenarios in order (each starts from the state the previous one left):

1. bundle v2 installs into slot B, the machine reboots into it, the health check marks it good;
2. a bundle signed with another key is refused and changes nothing;
3. power cut (QEMU killed) while v3 is being written: the machine still boots v2;
4. v3 whose gateway never gets READY installs into slot A, boots once, is marked bad by the health check
   and the machine falls back to v2 by itself.

Every scenario ends with the state store's value SET at the start still there: ``/var/lib/appliance`` is
on the data partition, outside both slots. The bundles are the image's own slot A (with the test's
shell, ``qemu.py``), a marker file ``/etc/gateway-test-version`` added with debugfs, and for v3 a drop-in
that makes ``appliance.service`` exit at once plus a shorter health-check timeout (60 s instead of 300:
the mechanism is the shipped one). They reach the guest on a second virtio disk. The update time
(``rauc install`` of v2, and install to a READY gateway on the new slot) is printed and written to
``build/qemu-timings.txt``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from appliance.statestore.client.blocking import StateStoreClient
from tests.images.gateway_checks import PROJECT, round_trip, state_store, write_timings
from tests.images.qemu import (
    BOOT_TIMEOUT_S,
    CELLULAR_APN,
    CELLULAR_PIN,
    TIMINGS,
    VirtMachine,
    debugfs,
    partitions,
    provisioned_machine,
)

# The first test also pays for the fixture (two squashfs bundles, a boot) before its install: under TCG on a
# loaded machine the install alone took 29 min at load 10-16, the bundles 20 min at load 28.
pytestmark = [pytest.mark.image, pytest.mark.timeout(10800)]

sys.path.insert(0, str(PROJECT / "images/gateway"))
import build_bundle  # noqa: E402

BROKEN_GATEWAY = "[Service]\nExecStart=\nExecStart=/bin/false\n"
SHORT_HEALTH_CHECK = "[Service]\nExecStart=\nExecStart=/usr/local/sbin/appliance-health-check --timeout 60\n"


@dataclass
class Updating:
    machine: VirtMachine
    bundles: Path  # the second disk's file
    timings: dict[str, float] = field(default_factory=dict)

    def start(self) -> float:
        """Start QEMU; returns the seconds to a READY gateway. The slot's health check has finished
        when this returns."""
        started = self.machine.start()
        self.machine.wait_for_mqtt(started + BOOT_TIMEOUT_S)
        ready = time.monotonic() - started
        self._settle()
        return ready

    def reboot(self) -> float:
        """``systemctl reboot`` in the guest; QEMU restarts it in place. Returns the seconds to READY."""
        assert self.machine.shell is not None
        self.machine.shell.sendall(b"systemctl reboot\n")
        self.machine._close_shell()
        started = time.monotonic()
        # First the old system's gateway stops answering, then the new one's answers.
        while answers(self.machine.mqtt_port):
            assert time.monotonic() < started + BOOT_TIMEOUT_S, "the gateway still answers long after the reboot"
            time.sleep(1)
        self.machine.wait_for_mqtt(started + 2 * BOOT_TIMEOUT_S)
        ready = time.monotonic() - started
        self._settle()
        return ready

    def _settle(self) -> None:
        """The test's shell, the slot's health check done (it writes the boot state an install or the
        test reads next), and the bundles' disk mounted."""
        self.machine.wait_for_shell(BOOT_TIMEOUT_S)
        self.machine.wait_for_unit_done("appliance-health-check.service", timeout=400)
        self.machine.run("mkdir -p /mnt/bundles && mount -o ro /dev/vdb /mnt/bundles")

    def version(self) -> str:
        return self.machine.run("cat /etc/gateway-test-version").stdout.strip()

    def boot_state(self) -> str:
        return self.machine.run("cat /boot/firmware/gw-boot.env").stdout


def answers(port: int) -> bool:
    try:
        return round_trip(port, "boot/going", b"down", timeout=5)
    except (OSError, ConnectionError):
        return False


def slot_variant(slot_a: Path, work: Path, version: str, units: dict[str, str]) -> Path:
    """A copy of the slot's file system with the version marker and ``units`` (path under
    /etc/systemd/system to text) added by debugfs."""
    variant = work / f"rootfs-{version}.ext4"
    subprocess.run(["cp", "--sparse=always", str(slot_a), str(variant)], check=True)
    (work / "version").write_text(version + "\n")
    commands = f"write {work / 'version'} /etc/gateway-test-version\n"
    for number, (path, text) in enumerate(units.items()):
        directory, name = path.rsplit("/", 1)
        unit = work / f"unit-{number}"
        unit.write_text(text)
        commands += f"mkdir /etc/systemd/system/{directory}\ncd /etc/systemd/system/{directory}\nwrite {unit} {name}\ncd /\n"
    debugfs(str(variant), commands, work)
    return variant


@pytest.fixture(scope="module")
def updating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Updating]:
    work = tmp_path_factory.mktemp("update")
    machine = provisioned_machine(work, "qemu-update")
    slot_a = work / "slot-a.ext4"
    part = partitions(machine.disk)[1]
    subprocess.run(["dd", f"if={machine.disk}", f"of={slot_a}", "bs=1M", f"skip={part.start // 2**20}",
                    f"count={part.size // 2**20}", "conv=sparse", "status=none"], check=True)
    cert, key = build_bundle.dev_keys(PROJECT / "build/rauc-keys")
    other_cert, other_key = build_bundle.dev_keys(work / "other-keys", name="somebody else")
    contents = work / "bundles"
    contents.mkdir()
    v2 = slot_variant(slot_a, work, "2", {})
    build_bundle.build_bundle(v2, "2.0.0", contents / "v2.raucb", cert, key)
    # The same bundle signed again by somebody else's key (``rauc resign``: no second squashfs to build).
    subprocess.run(
        ["rauc", "resign", f"--cert={other_cert}", f"--key={other_key}", f"--keyring={cert}", f"--signing-keyring={other_cert}",
         str(contents / "v2.raucb"), str(contents / "foreign.raucb")],
        check=True, capture_output=True,
    )
    v3 = slot_variant(slot_a, work, "3", {
        "appliance.service.d/broken.conf": BROKEN_GATEWAY, "appliance-health-check.service.d/short.conf": SHORT_HEALTH_CHECK,
    })
    build_bundle.build_bundle(v3, "3.0.0", contents / "v3.raucb", cert, key)
    for variant in (slot_a, v2, v3):
        variant.unlink()
    bundles = work / "bundles.ext4"
    size_mb = sum(path.stat().st_size for path in contents.iterdir()) // 2**20 + 64
    subprocess.run(["mkfs.ext4", "-q", "-d", str(contents), str(bundles), f"{size_mb}M"], check=True)
    machine.extra_drives.append(bundles)
    result = Updating(machine, bundles)
    try:
        result.timings["boot to ready (slot A as flashed)"] = result.start()
        with store(machine) as client:
            assert client.set(b"survivor", b"before every update").applied
        yield result
    finally:
        machine.shutdown()
        write_timings(result.timings, TIMINGS, append=True)


def store(machine: VirtMachine) -> StateStoreClient:
    return state_store(machine.mqtt_port, "update-check", timeout=30)


def assert_data_survived(machine: VirtMachine) -> None:
    with store(machine) as client:
        assert client.get(b"survivor").value == b"before every update"


def test_bundle_v2_installs_into_slot_b_boots_and_is_marked_good(updating: Updating) -> None:
    machine = updating.machine
    started = time.monotonic()
    installed = machine.run("rauc install /mnt/bundles/v2.raucb", timeout=5400)
    updating.timings["rauc install v2"] = time.monotonic() - started
    assert installed.returncode == 0, installed.stdout
    assert updating.boot_state() == "BOOT_ORDER=B A\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n"
    updating.timings["reboot into v2 to ready"] = updating.reboot()
    updating.timings["update v2: install to a READY gateway"] = time.monotonic() - started
    assert machine.booted_slots()[-1] == "B"
    assert updating.version() == "2"
    assert machine.run("systemctl show appliance-health-check -p Result --value").stdout.strip() == "success"
    assert updating.boot_state() == "BOOT_ORDER=B A\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n"
    doctor = machine.run("/opt/appliance/venv/bin/appliance doctor --config /etc/appliance/gateway.toml", timeout=900).stdout
    assert "running root slot B (rootfs.1), version 2.0.0" in doctor, doctor
    assert_data_survived(machine)
    assert machine.cellular_profile() == (CELLULAR_APN, CELLULAR_PIN)  # the APN outlived the slot


def test_a_bundle_signed_with_another_key_is_refused_and_changes_nothing(updating: Updating) -> None:
    machine = updating.machine
    before = updating.boot_state()
    refused = machine.run("rauc install /mnt/bundles/foreign.raucb", timeout=1800)
    assert refused.returncode != 0
    assert "signature verification failed" in refused.stdout, refused.stdout
    assert updating.boot_state() == before
    assert_data_survived(machine)


def test_a_power_cut_during_an_install_still_boots_v2(updating: Updating) -> None:
    machine = updating.machine
    # In the background (setsid --fork: the shell's command line takes no trailing "&"), its progress
    # line by line in a file.
    machine.run("setsid --fork sh -c 'stdbuf -oL rauc install /mnt/bundles/v3.raucb > /root/install.log 2>&1'")
    deadline = time.monotonic() + 1800
    while "Copying image" not in machine.run("cat /root/install.log").stdout:
        assert time.monotonic() < deadline, machine.run("cat /root/install.log").stdout
        time.sleep(2)
    time.sleep(5)  # into the write of slot A
    machine.power_cut()
    updating.timings["boot to ready after a power cut during an install"] = updating.start()
    assert machine.booted_slots()[-1] == "B"
    # RAUC marked slot A bad before writing it, and that reached the card before the cut: the boot script
    # saw no attempts left for A (it would not boot a half-written slot even if it were first in the order).
    boots = re.findall(r"gateway: booting slot ([AB]) \(partition \d; attempts left A=(\d) B=(\d)\)", machine.console_text())
    assert boots[-1] == ("B", "0", "2"), boots
    assert updating.version() == "2"
    assert_data_survived(machine)


def test_a_v3_that_never_gets_ready_falls_back_to_v2_by_itself(updating: Updating) -> None:
    machine = updating.machine
    installed = machine.run("rauc install /mnt/bundles/v3.raucb", timeout=5400)
    assert installed.returncode == 0, installed.stdout
    assert updating.boot_state().startswith("BOOT_ORDER=A B\n")
    booted_before = len(machine.booted_slots())
    started = time.monotonic()
    # v3's gateway never answers, so waiting for MQTT is waiting for the fallback: A, marked bad, then B.
    updating.timings["v3 installed to v2 READY again (fallback)"] = updating.reboot()
    assert machine.booted_slots()[booted_before:] == ["A", "B"], machine.booted_slots()
    assert updating.version() == "2"
    assert time.monotonic() - started > 60  # v3 had its health check's whole time
    assert "BOOT_A_LEFT=0" in updating.boot_state()
    assert_data_survived(machine)
