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
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.statestore.client.blocking import StateStoreClient
from testing import paho_clients
from tests.images.qemu import VirtMachine, copy_to_boot

pytestmark = [pytest.mark.image, pytest.mark.timeout(1800)]

PROJECT = Path(__file__).resolve().parents[2]
GATEWAY_ID = "qemu-042"
USER, PASSWORD = "tester", "s3cret-pass"
#: An emulated boot on a loaded 2-core machine: 40-60 s quiet, several minutes beside other builds.
BOOT_TIMEOUT_S = 900.0


def image_under_test() -> Path | None:
    given = os.environ.get("GATEWAY_IMAGE")
    if given:
        return Path(given)
    built = sorted((PROJECT / "dist").glob("gateway-*-arm64.img.zst"), key=lambda path: path.stat().st_mtime)
    return built[-1] if built else None


def prerequisites_missing() -> str | None:
    for tool in ("qemu-system-aarch64", "zstd", "mcopy", "debugfs", "sfdisk"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test-image-slow installs it)"
    if image_under_test() is None:
        return "no dist/gateway-*-arm64.img.zst (make test-image-slow builds it with make image)"
    return None


@dataclass
class Booted:
    machine: VirtMachine
    timings: dict[str, float] = field(default_factory=dict)

    def boot(self, label: str) -> None:
        """Start the machine and wait for a READY gateway answering MQTT; records ``label``'s seconds."""
        started = self.machine.start()
        wait_for_mqtt(self.machine.mqtt_port, started + BOOT_TIMEOUT_S, self.machine)
        self.timings[label] = time.monotonic() - started
        self.machine.wait_for_shell(timeout=BOOT_TIMEOUT_S)


def write_timings(timings: dict[str, float]) -> None:
    text = "".join(f"{name}: {seconds:.1f} s\n" for name, seconds in timings.items())
    print("\n" + text, end="")
    (PROJECT / "build").mkdir(exist_ok=True)
    (PROJECT / "build/qemu-timings.txt").write_text(text)


def wait_for_mqtt(port: int, deadline: float, machine: VirtMachine) -> None:
    """Until a QoS 1 round trip with the provisioned account succeeds through the forwarded port."""
    while True:
        try:
            if round_trip(port, "boot/ready", b"ready", timeout=5):
                return
        except (OSError, ConnectionError):
            pass
        if machine.process is not None and machine.process.poll() is not None:
            raise RuntimeError(f"QEMU exited:\n{machine.console_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gateway never answered MQTT:\n{machine.console_text()[-3000:]}")
        time.sleep(1)


def round_trip(port: int, topic: str, payload: bytes, timeout: float) -> bool:
    received: list[bytes] = []
    arrived = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"host-{topic.replace('/', '-')}", protocol=mqtt.MQTTv5)
    client.username_pw_set(USER, PASSWORD)
    client.on_message = lambda _client, _userdata, message: (received.append(message.payload), arrived.set())
    subscribed = threading.Event()
    client.on_subscribe = lambda *_: subscribed.set()
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        if not subscribed.wait(timeout):
            return False
        client.publish(topic, payload, qos=1).wait_for_publish(timeout)
        return arrived.wait(timeout) and received == [payload]
    finally:
        paho_clients.close(client)


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    missing = prerequisites_missing()
    if missing:
        pytest.skip(missing)
    image = image_under_test()
    assert image is not None
    work = tmp_path_factory.mktemp("qemu")
    machine = VirtMachine.from_image(image, work)
    # What the technician puts on the FAT partition before the first boot.
    (work / "appliance.toml").write_text(f'[gateway]\nid = "{GATEWAY_ID}"\n')
    subprocess.run(
        [sys.executable, "-m", "appliance", "passwd", "-c", "-b", str(work / "appliance-passwd"), USER, PASSWORD],
        check=True, cwd=PROJECT,
    )
    for name in ("appliance.toml", "appliance-passwd"):
        copy_to_boot(machine.disk, machine.boot_partition, work / name)
    result = Booted(machine)
    try:
        result.boot("boot to ready (QEMU started to the first MQTT round trip)")
        write_timings(result.timings)
        yield result
    finally:
        machine.shutdown()
        write_timings(result.timings)


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
    shown = show(machine, "appliance-health-check.service", "Result", "ActiveState")
    assert shown == {"Result": "success", "ActiveState": "active"}, machine.run("journalctl -u appliance-health-check --no-pager").stdout
    # The boot script took an attempt (3 -> 2); marking good gave it back.
    assert machine.run("cat /boot/firmware/gw-boot.env").stdout == "BOOT_ORDER=A B\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n"
    status = json.loads(machine.run("rauc status --output-format=json").stdout)
    slots = {name: slot for entry in status["slots"] for name, slot in entry.items()}
    assert status["booted"] == "A" and slots["rootfs.0"]["boot_status"] == "good", status
    doctor = machine.run("/opt/appliance/venv/bin/appliance doctor --config /etc/appliance/gateway.toml", timeout=300).stdout
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


def test_mqtt_and_the_state_store_answer_from_the_host(booted: Booted) -> None:
    port = booted.machine.mqtt_port
    assert round_trip(port, "check/loop", b"through qemu", timeout=20)
    with StateStoreClient("127.0.0.1", port, "host-statestore", username=USER, password=PASSWORD, timeout=20) as store:
        assert store.set(b"site", b"qemu").applied
        assert store.get(b"site").value == b"qemu"


def durable_subscriber(port: int) -> tuple[mqtt.Client, dict[str, bytes]]:
    received: dict[str, bytes] = {}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="keeper", protocol=mqtt.MQTTv5)
    client.username_pw_set(USER, PASSWORD)
    client.on_message = lambda _client, _userdata, message: received.__setitem__(message.topic, message.payload)
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    connected = threading.Event()
    client.on_connect = lambda *_: connected.set()
    client.connect("127.0.0.1", port, clean_start=False, properties=properties)
    client.loop_start()
    assert connected.wait(20)
    return client, received


def test_a_power_cut_loses_no_acknowledged_publish_or_set(booted: Booted) -> None:
    machine = booted.machine
    keeper, _ = durable_subscriber(machine.mqtt_port)
    subscribed = threading.Event()
    keeper.on_subscribe = lambda *_: subscribed.set()
    keeper.subscribe("cut/#", qos=1)
    assert subscribed.wait(20)
    paho_clients.close(keeper)  # offline: what is published now is queued in its durable session
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cut-publisher", protocol=mqtt.MQTTv5)
    publisher.username_pw_set(USER, PASSWORD)
    publisher.connect("127.0.0.1", machine.mqtt_port)
    publisher.loop_start()
    try:
        for n in range(50):
            info = publisher.publish(f"cut/{n}", b"%d" % n, qos=1)
            info.wait_for_publish(20)
            assert info.is_published() and info.rc == mqtt.MQTT_ERR_SUCCESS
    finally:
        paho_clients.close(publisher)
    with StateStoreClient("127.0.0.1", machine.mqtt_port, "cut-statestore", username=USER, password=PASSWORD, timeout=20) as store:
        for n in range(20):
            assert store.set(b"cut-%d" % n, b"value-%d" % n).applied

    machine.power_cut()
    booted.boot("boot to ready after a power cut")
    keeper, received = durable_subscriber(machine.mqtt_port)
    try:
        deadline = time.monotonic() + 60
        while len(received) < 50 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        paho_clients.close(keeper)
    assert received == {f"cut/{n}": b"%d" % n for n in range(50)}
    with StateStoreClient("127.0.0.1", machine.mqtt_port, "cut-check", username=USER, password=PASSWORD, timeout=20) as store:
        assert [store.get(b"cut-%d" % n).value for n in range(20)] == [b"value-%d" % n for n in range(20)]
