"""The flashable image as ``make image`` wrote it to ``dist/``, inspected without booting it: ``make test-image-slow``.

What a Raspberry Pi 4 and a field box need that an emulated boot cannot show: the boot partition holds
what the Pi's firmware reads (``start4.elf``, ``fixup4.dat``, the board's device tree, ``config.txt``
starting U-Boot, ``cmdline.txt``) and a U-Boot for the Pi with every command the A/B boot script uses;
the slot boots its own kernel and initramfs; the Pi's Wi-Fi firmware; the uplink (NetworkManager and
ModemManager enabled, the AT port left to the gateway, profiles kept on the data partition); RAUC's
configuration and keyring; the data partition's owners and modes; the checksum, manifest and bundle
beside the image. Read with the tools a technician has (``sfdisk``, mtools, ``debugfs``), on a
decompressed copy: no mount, no loop device.

The image is ``$GATEWAY_IMAGE`` (``.img.zst``, or a plain ``.img`` without the files beside it) or the newest
``dist/gateway-*-arm64.img.zst``, as for ``test_qemu_boot.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.images.gateway_checks import PROJECT
from tests.images.qemu import Partition, boot_files, image_under_test, partitions

pytestmark = [pytest.mark.image, pytest.mark.timeout(600)]

sys.path.insert(0, str(PROJECT / "images/gateway"))
import build_bundle  # noqa: E402
import build_image  # noqa: E402

#: Commands of ``uboot/boot.cmd`` a U-Boot build may leave out (the Pi's build is not the one QEMU boots):
#: without them the boot script cannot count attempts or boot an arm64 kernel.
OPTIONAL_BOOT_SCRIPT_COMMANDS = ("fatload", "fatwrite", "setexpr", "booti")
#: The Pi 4's radio (CYW43455): the firmware, its regulatory blob and the board's NVRAM file.
PI4_WIFI_FIRMWARE = ("brcmfmac43455-sdio.bin", "brcmfmac43455-sdio.clm_blob", "brcmfmac43455-sdio.raspberrypi,4-model-b.txt")
ENABLED_UNITS = (
    "appliance.service", "appliance-firstboot.service", "appliance-health-check.service",
    "appliance-uplink-provision.service", "NetworkManager.service", "ModemManager.service",
)
MANIFEST_PACKAGES = (
    "linux-image-arm64", "raspi-firmware", "firmware-brcm80211", "u-boot-rpi", "rauc", "rauc-service",
    "network-manager", "modemmanager", "python3",
)


@dataclass(frozen=True)
class Flashed:
    image: Path  # the .img.zst in dist/
    disk: Path  # its decompressed copy
    table: list[Partition]

    @property
    def boot(self) -> str:
        """The FAT partition, as mtools addresses it."""
        return f"{self.disk}@@{self.table[0].start}"

    def ext4(self, number: int) -> str:
        """Partition ``number`` (1-based), as debugfs addresses it."""
        return f"{self.disk}?offset={self.table[number - 1].start}"

    def read(self, number: int, path: str) -> str:
        return debugfs(self.ext4(number), f"cat {path}")


def debugfs(file_system: str, request: str) -> str:
    return subprocess.run(["debugfs", "-R", request, file_system], capture_output=True, text=True, check=True).stdout


def listing(file_system: str, directory: str) -> set[str]:
    """The names in ``directory`` of an ext4 file system (``ls -p``: ``/inode/mode/uid/gid/name/size/``)."""
    return {line.split("/")[5] for line in debugfs(file_system, f"ls -p {directory}").splitlines() if line.count("/") >= 6}


@pytest.fixture(scope="module")
def flashed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flashed]:
    for tool in ("zstd", "mtype", "debugfs", "sfdisk"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (make test-image-slow installs it)")
    image = image_under_test()
    if image is None:
        pytest.skip("no dist/gateway-*-arm64.img.zst (make test-image-slow builds it with make image)")
    disk = tmp_path_factory.mktemp("flashed") / "disk.img"
    if image.suffix == ".zst":
        subprocess.run(["zstd", "-q", "-d", "-f", "--sparse", str(image), "-o", str(disk)], check=True)
    else:
        subprocess.run(["cp", "--sparse=always", str(image), str(disk)], check=True)
    yield Flashed(image, disk, partitions(disk))
    disk.unlink()


def test_the_image_comes_with_its_checksum_manifest_and_signed_bundle(flashed: Flashed) -> None:
    image = flashed.image
    if image.suffix != ".zst":
        pytest.skip(f"{image} is not what make image writes to dist/")
    checksum = Path(f"{image}.sha256").read_text().split()
    assert checksum == [hashlib.sha256(image.read_bytes()).hexdigest(), image.name]
    manifest = Path(str(image).removesuffix(".zst") + ".manifest").read_text()
    packages = {line.split("\t")[0] for line in manifest.splitlines() if "\t" in line}
    assert set(MANIFEST_PACKAGES) <= packages, sorted(set(MANIFEST_PACKAGES) - packages)
    assert re.search(r"^appliance-[^-]+-py3-none-any\.whl$", manifest, re.M), manifest
    version = re.match(r"gateway-(.+)-arm64\.img\.zst$", image.name)
    assert version is not None
    bundle = image.with_name(f"gateway-{version.group(1)}-arm64.raucb")
    keys = PROJECT / "build/rauc-keys/cert.pem"
    if shutil.which("rauc") is None or not keys.exists():
        pytest.skip("rauc or the signing certificate is missing: make image makes both")
    info = subprocess.run(
        ["rauc", "info", f"--keyring={keys}", "--output-format=json", str(bundle)], capture_output=True, text=True, check=True,
    )
    described = json.loads(info.stdout)
    assert described["compatible"] == build_bundle.COMPATIBLE and described["version"] == version.group(1), described


def test_the_boot_partition_holds_what_the_pi4_firmware_reads(flashed: Flashed) -> None:
    names = set(boot_files(flashed.disk, flashed.table[0]))
    assert {*build_image.PI4_BOOT_FILES, "u-boot.bin", "boot.scr"} <= names, names
    # The kernel and initramfs come from the slot U-Boot boots; nothing to provision is left on it.
    assert not any(name.startswith(("vmlinuz", "initrd", "appliance")) or name.endswith(".nmconnection") for name in names), names

    def text(name: str) -> str:
        return subprocess.run(["mtype", "-i", flashed.boot, f"::{name}"], capture_output=True, text=True, check=True).stdout

    config = text("config.txt")
    assert "arm_64bit=1" in config.splitlines(), config
    assert config.splitlines()[-1] == "kernel=u-boot.bin", config
    assert not [line for line in config.splitlines() if line.startswith(("initramfs ", "kernel=vmlinuz"))], config
    assert "console=" in text("cmdline.txt")
    label = subprocess.run(["mlabel", "-s", "-i", flashed.boot, "::"], capture_output=True, text=True, check=True).stdout
    assert build_image.BOOT_LABEL in label


def test_the_pis_u_boot_has_the_commands_the_boot_script_needs(flashed: Flashed, tmp_path: Path) -> None:
    subprocess.run(["mcopy", "-n", "-i", flashed.boot, "::u-boot.bin", str(tmp_path / "u-boot.bin")], check=True)
    firmware = (tmp_path / "u-boot.bin").read_bytes()
    assert len(firmware) > 200_000  # a real build, not a placeholder
    # U-Boot's command table names each command with a NUL-terminated string.
    missing = [command for command in OPTIONAL_BOOT_SCRIPT_COMMANDS if command.encode() + b"\0" not in firmware]
    assert not missing, f"the Pi's U-Boot lacks {missing}: the A/B boot script cannot run there"
    script = build_image.BOOT_SCRIPT.read_text()
    assert all(re.search(rf"\b{command}\b", script) for command in OPTIONAL_BOOT_SCRIPT_COMMANDS)


def test_slot_a_boots_its_own_kernel_and_initramfs(flashed: Flashed) -> None:
    slot = flashed.ext4(2)
    boot = listing(slot, "/boot")
    kernels = sorted(name for name in boot if name.startswith("vmlinuz-"))
    assert len(kernels) == 1, boot
    version = kernels[0].removeprefix("vmlinuz-")
    assert f"initrd.img-{version}" in boot
    assert f'Fast link dest: "{kernels[0]}"' in debugfs(slot, "stat /boot/vmlinuz")
    assert f'Fast link dest: "initrd.img-{version}"' in debugfs(slot, "stat /boot/initrd.img")
    assert version in listing(slot, "/usr/lib/modules")
    assert listing(slot, "/boot/firmware") <= {".", ".."}  # the mount point of the FAT partition, empty


def test_the_pi4_wifi_firmware_is_in_the_root(flashed: Flashed) -> None:
    present = listing(flashed.ext4(2), "/usr/lib/firmware/brcm")
    assert set(PI4_WIFI_FIRMWARE) <= present, sorted(set(PI4_WIFI_FIRMWARE) - present)


def test_the_gateway_and_the_uplink_start_at_boot(flashed: Flashed) -> None:
    slot = flashed.ext4(2)
    wants = listing(slot, "/etc/systemd/system/multi-user.target.wants")
    assert set(ENABLED_UNITS) <= wants, sorted(set(ENABLED_UNITS) - wants)
    # A cellular link that registers late must not fail the boot (images/gateway/README.md).
    assert 'Fast link dest: "/dev/null"' in debugfs(slot, "stat /etc/systemd/system/NetworkManager-wait-online.service")


def test_the_at_port_is_left_to_the_gateway_and_profiles_live_on_the_data_partition(flashed: Flashed) -> None:
    rule = flashed.read(2, "/etc/udev/rules.d/77-appliance-modem.rules")
    ignoring = [line for line in rule.splitlines() if not line.startswith("#") and 'ENV{ID_MM_PORT_IGNORE}="1"' in line]
    assert len(ignoring) >= 2 and all('SYMLINK+="appliance-modem-at"' in line for line in ignoring), rule
    # The config the gateway starts with (on the data partition) opens that port by the rule's name for it.
    assert 'port = "/dev/appliance-modem-at"' in flashed.read(4, "/etc-appliance/gateway.toml").splitlines()
    assert "path=/data/network-connections" in flashed.read(2, "/etc/NetworkManager/conf.d/50-appliance.conf").splitlines()
    assert "d /data/network-connections 0700 root root -" in flashed.read(2, "/etc/tmpfiles.d/appliance-network.conf")
    unit = flashed.read(2, "/etc/systemd/system/appliance-uplink-provision.service")
    assert "Before=NetworkManager.service" in unit and "ReadWritePaths=/data/network-connections /boot/firmware" in unit


def test_rauc_knows_the_slots_and_trusts_only_the_signing_key(flashed: Flashed) -> None:
    conf = flashed.read(2, "/etc/rauc/system.conf")
    assert f"compatible={build_bundle.COMPATIBLE}" in conf.splitlines()
    for slot, partuuid in (("rootfs.0", "47617465-02"), ("rootfs.1", "47617465-03")):
        assert f"[slot.{slot}]\ndevice=/dev/disk/by-partuuid/{partuuid}\n" in conf, conf
    keys = PROJECT / "build/rauc-keys/cert.pem"
    if keys.exists():
        assert flashed.read(2, "/etc/rauc/keyring.pem") == keys.read_text()


def test_the_data_partition_belongs_to_the_gateway(flashed: Flashed) -> None:
    passwd = flashed.read(2, "/etc/passwd")
    [account] = [line.split(":") for line in passwd.splitlines() if line.startswith("appliance:")]
    uid, gid = account[2], account[3]
    data = flashed.ext4(4)
    state = debugfs(data, "stat /appliance")
    assert "Mode:  0750" in state and f"User: {uid:>5}   Group: {gid:>5}" in state, state
    config = debugfs(data, "stat /etc-appliance/gateway.toml")
    assert "Mode:  0640" in config and f"User:     0   Group: {gid:>5}" in config, config
    # RAUC's status: root's to write, the gateway's group's to read (the installed version on its metrics page).
    rauc = debugfs(data, "stat /rauc")
    assert "Mode:  0750" in rauc and f"User:     0   Group: {gid:>5}" in rauc, rauc
    assert "d /data/rauc 0750 root appliance -" in flashed.read(2, "/etc/tmpfiles.d/appliance-rauc.conf")
    assert build_image.DATA_LABEL in subprocess.run(
        ["debugfs", "-R", "show_super_stats -h", data], capture_output=True, text=True, check=True,
    ).stdout
