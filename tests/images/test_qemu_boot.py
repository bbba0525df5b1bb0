"""The arm64 disk image itself, booted under ``qemu-system-aarch64 -M virt`` (TCG, no KVM): ``make test-image-slow``.

What ``test_nspawn_boot.py`` checks on the native root in a container, checked here on the flashable
image on an emulated arm64 machine with its own kernel, initramfs, fstab by label and udev: the boot ends
in ``running``, the gateway is READY through sd_notify, first-boot provisioning took the files off the FAT
boot partition, MQTT and the state store answer from the host through QEMU's forwarded port, and a power
cut (QEMU killed) after acknowledged QoS 1 publishes and ``+OK`` SETs loses none of them. Boot-to-ready
(QEMU started to the first MQTT round trip with the provisioned account) is printed and written to
``build/qemu-timings.txt``.

The image is ``$GATEWAY_IMAGE`` (``.img.zst`` or a plain ``.img``) or the newest ``dist/gateway-*-arm64.img.zst`` (``make test-image-slow``
builds it first with ``make image``). Emulated, a boot takes one to a few minutes: marked ``image``, so
``make test`` never runs it, and run by path, so ``make test-image`` does not either.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.images.gateway_checks import (
    USER,
    acknowledge_before_power_cut,
    assert_nothing_acknowledged_was_lost,
    round_trip,
    state_store,
    write_timings,
)
from tests.images.qemu import (
    BOOT_TIMEOUT_S,
    CELLULAR_APN,
    CELLULAR_PIN,
    TIMINGS,
    VirtMachine,
    provisioned_machine,
)

pytestmark = [pytest.mark.image, pytest.mark.timeout(3600)]

GATEWAY_ID = "qemu-042"


@dataclass
class Booted:
    machine: VirtMachine
    timings: dict[str, float] = field(default_factory=dict)

    def boot(self, label: str) -> None:
        """Start the machine and wait for a READY gateway answering MQTT; records ``label``'s seconds."""
        started = self.machine.start()
        self.machine.wait_for_mqtt(started + BOOT_TIMEOUT_S)
        self.timings[label] = time.monotonic() - started
        self.machine.wait_for_shell(timeout=BOOT_TIMEOUT_S)


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    machine = provisioned_machine(tmp_path_factory.mktemp("qemu"), GATEWAY_ID)
    result = Booted(machine)
    try:
        result.boot("boot to ready (QEMU started to the first MQTT round trip)")
        write_timings(result.timings, TIMINGS)
        yield result
    finally:
        machine.shutdown()
        write_timings(result.timings, TIMINGS)


def show(machine: VirtMachine, unit: str, *properties: str) -> dict[str, str]:
    output = machine.run(f"systemctl show {unit} --property={','.join(properties)}").stdout
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def test_boots_to_running_with_no_failed_units(booted: Booted) -> None:
    machine = booted.machine
    state = machine.run("systemctl is-system-running --wait", timeout=BOOT_TIMEOUT_S).stdout.strip().splitlines()[-1]
    failed = machine.run("systemctl list-units --failed --plain --no-legend").stdout
    assert state == "running", failed
    assert machine.run("uname -m").stdout.strip() == "aarch64"


def test_the_gateway_is_ready_through_sd_notify_as_its_own_user(booted: Booted) -> None:
    shown = show(booted.machine, "appliance.service", "ActiveState", "SubState", "Type", "StatusText", "User", "NRestarts")
    assert shown["ActiveState"] == "active" and shown["SubState"] == "running" and shown["Type"] == "notify", shown
    assert shown["StatusText"], shown  # set with READY=1
    assert shown["User"] == "appliance" and shown["NRestarts"] == "0", shown


def test_the_boot_script_booted_slot_a_and_the_health_check_marked_it_good(booted: Booted) -> None:
    machine = booted.machine
    assert machine.booted_slots()[:1] == ["A"]
    cmdline = machine.run("cat /proc/cmdline").stdout
    assert "rauc.slot=A" in cmdline and "root=PARTUUID=47617465-02" in cmdline, cmdline
    machine.wait_for_unit_done("appliance-health-check.service", timeout=400)
    shown = show(machine, "appliance-health-check.service", "Result", "ActiveState")
    assert shown == {"Result": "success", "ActiveState": "active"}, machine.run("journalctl -u appliance-health-check --no-pager").stdout
    # The boot script took an attempt (3 -> 2); marking good gave it back.
    assert machine.run("cat /boot/firmware/gw-boot.env").stdout == "BOOT_ORDER=A B\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n"
    status = json.loads(machine.run("rauc status --output-format=json").stdout)
    slots = {name: slot for entry in status["slots"] for name, slot in entry.items()}
    assert status["booted"] == "A" and slots["rootfs.0"]["boot_status"] == "good", status
    doctor = machine.run("/opt/appliance/venv/bin/appliance doctor --config /etc/appliance/gateway.toml", timeout=900).stdout
    assert "running root slot A (rootfs.0), version as flashed" in doctor, doctor


def test_the_gateways_data_and_config_are_on_the_data_partition(booted: Booted) -> None:
    def source(target: str) -> str:
        return booted.machine.run(f"findmnt -n -o SOURCE --mountpoint {target}").stdout.strip()

    assert source("/data") == "/dev/vda4"
    assert source("/var/lib/appliance") == "/dev/vda4[/appliance]"
    assert source("/etc/appliance") == "/dev/vda4[/etc-appliance]"


def test_first_boot_provisioning_took_the_files_off_the_boot_partition(booted: Booted) -> None:
    machine = booted.machine
    shown = show(machine, "appliance-firstboot.service", "Result", "ExecMainStatus")
    assert shown == {"Result": "success", "ExecMainStatus": "0"}, shown
    assert machine.run("ls -A /boot/firmware | grep -c '^appliance' || true").stdout.strip() == "0"
    assert f'id = "{GATEWAY_ID}"' in machine.run("cat /etc/appliance/gateway.toml").stdout
    assert machine.run(f"grep -c '^{USER}:' /etc/appliance/passwd").stdout.strip() == "1"
    modes = machine.run("stat -c '%n %a %U:%G' /etc/appliance/gateway.toml /etc/appliance/passwd /var/lib/appliance").stdout
    assert modes.split("\n")[:3] == [
        "/etc/appliance/gateway.toml 640 root:appliance", "/etc/appliance/passwd 640 root:appliance",
        "/var/lib/appliance 750 appliance:appliance",
    ], modes


def test_the_uplink_profile_went_from_the_boot_partition_to_networkmanager_on_the_data_partition(booted: Booted) -> None:
    machine = booted.machine
    for unit in ("NetworkManager.service", "ModemManager.service"):
        assert machine.run(f"systemctl is-active {unit}").stdout.strip() == "active", unit
    shown = show(machine, "appliance-uplink-provision.service", "Result", "ExecMainStatus")
    assert shown == {"Result": "success", "ExecMainStatus": "0"}, shown
    assert machine.run("ls -A /boot/firmware | grep -c 'nmconnection$' || true").stdout.strip() == "0"
    assert machine.run("stat -c '%a %U:%G' /data/network-connections/cellular.nmconnection").stdout.strip() == "600 root:root"
    assert machine.cellular_profile() == (CELLULAR_APN, CELLULAR_PIN)
    # No modem on QEMU's virt machine: doctor says so, and the gateway serves on (the other tests).
    doctor = machine.run("/opt/appliance/venv/bin/appliance doctor --config /etc/appliance/gateway.toml", timeout=900).stdout
    assert "NetworkManager knows no cellular modem" in doctor, doctor


def test_mqtt_and_the_state_store_answer_from_the_host(booted: Booted) -> None:
    port = booted.machine.mqtt_port
    assert round_trip(port, "check/loop", b"through qemu", timeout=20)
    with state_store(port, "host-statestore", timeout=20) as store:
        assert store.set(b"site", b"qemu").applied
        assert store.get(b"site").value == b"qemu"


def test_a_power_cut_loses_no_acknowledged_publish_or_set(booted: Booted) -> None:
    acknowledge_before_power_cut(booted.machine.mqtt_port, timeout=20)
    booted.machine.power_cut()
    booted.boot("boot to ready after a power cut")
    assert_nothing_acknowledged_was_lost(booted.machine.mqtt_port, timeout=60)
