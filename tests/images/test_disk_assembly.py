"""``build_image.py``'s disk assembly on a small stand-in root, with the real tools (mkfs.vfat, mcopy,
mkfs.ext4 -d, sfdisk, dd, mkimage) and read back with others (sfdisk --json, mtools, debugfs): the A/B
partition table, the boot partition's files (U-Boot started by the Pi firmware, the boot script, no
kernel), slot A's owners and modes, an empty slot B, and the data partition the gateway's state moves to."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "images/gateway"))
import build_image  # noqa: E402

TOOLS = ("mkfs.vfat", "mcopy", "mtype", "mkfs.ext4", "debugfs", "sfdisk", "mkimage")
pytestmark = [
    pytest.mark.skipif(any(shutil.which(tool) is None for tool in TOOLS),
                       reason="needs dosfstools, mtools, e2fsprogs, fdisk, u-boot-tools"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a root's owners can only be staged as root"),
]
APPLIANCE_UID = 996
IMAGE_ROOTFS = Path(__file__).resolve().parents[2] / "images/gateway/image-rootfs"


def stand_in_root(root: Path) -> None:
    boot = root / "boot/firmware"
    boot.mkdir(parents=True)
    for name in build_image.PI4_BOOT_FILES:
        (boot / name).write_text(f"{name}\n")
    (boot / "config.txt").write_text("arm_64bit=1\nkernel=vmlinuz-6.1.0-50-arm64\ninitramfs initrd.img-6.1.0-50-arm64\n")
    (boot / "vmlinuz-6.1.0-50-arm64").write_bytes(b"kernel")
    (boot / "initrd.img-6.1.0-50-arm64").write_bytes(b"initrd")
    (boot / "overlays").mkdir()
    (boot / "overlays/disable-bt.dtbo").write_bytes(b"\xd0\x0d\xfe\xed")
    (root / build_image.PI_UBOOT).parent.mkdir(parents=True)
    (root / build_image.PI_UBOOT).write_bytes(b"u-boot for the pi")
    config = root / "etc/appliance"
    config.mkdir(parents=True)
    (config / "gateway.toml").write_text("[gateway]\n")
    os.chown(config / "gateway.toml", 0, APPLIANCE_UID)
    (config / "gateway.toml").chmod(0o640)
    (root / "etc/passwd").write_text(f"root:x:0:0:root:/root:/bin/bash\nappliance:x:{APPLIANCE_UID}:{APPLIANCE_UID}::/:/usr/sbin/nologin\n")
    (root / "opt/appliance/wheels").mkdir(parents=True)
    (root / "sbin").symlink_to("usr/sbin")


def debugfs(file_system: str, request: str) -> str:
    return subprocess.run(["debugfs", "-R", request, file_system], capture_output=True, text=True, check=True).stdout


def test_an_ab_disk_from_a_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    stand_in_root(root)
    boot, slot, data, image = tmp_path / "boot.vfat", tmp_path / "rootfs.ext4", tmp_path / "data.ext4", tmp_path / "disk.img"
    build_image.boot_partition(root, tmp_path, boot)
    build_image.slot_image(root, tmp_path, slot)
    build_image.data_partition(root, tmp_path, data)
    build_image.disk(boot, slot, data, image)

    table = json.loads(subprocess.run(["sfdisk", "--json", str(image)], capture_output=True, text=True, check=True).stdout)
    partitions = table["partitiontable"]["partitions"]
    assert table["partitiontable"]["label"] == "dos" and table["partitiontable"]["id"] == "0x47617465"
    assert [(p["type"], p.get("bootable", False)) for p in partitions] == [("c", True), ("83", False), ("83", False), ("83", False)]
    assert partitions[0]["start"] == 16384
    for before, after in zip(partitions, partitions[1:], strict=False):
        assert after["start"] == before["start"] + before["size"]
    assert partitions[1]["size"] == partitions[2]["size"] == build_image.SLOT_MB * 2048

    # The boot partition as the Pi's firmware reads it: FAT at the first partition's offset.
    offset = f"{image}@@{partitions[0]['start'] * 512}"
    config = subprocess.run(["mtype", "-i", offset, "::config.txt"], capture_output=True, text=True, check=True).stdout
    assert "kernel=vmlinuz" not in config and "initramfs" not in config and config.endswith("kernel=u-boot.bin\n"), config
    listing = subprocess.run(["mdir", "-b", "-i", offset, "::"], capture_output=True, text=True, check=True).stdout
    names = {line.rstrip("/").rsplit("/", 1)[-1] for line in listing.split()}
    assert {"u-boot.bin", "boot.scr", "start4.elf", "bcm2711-rpi-4-b.dtb", "overlays"} <= names, names
    assert not any(name.startswith(("vmlinuz", "initrd")) for name in names)  # the kernel comes from the slot
    script = subprocess.run(["mtype", "-i", offset, "::boot.scr"], capture_output=True, check=True).stdout
    assert script[:4] == b"\x27\x05\x19\x56" and b"rauc.slot=${slot}" in script  # a U-Boot legacy image
    label = subprocess.run(["mlabel", "-s", "-i", offset, "::"], capture_output=True, text=True, check=True).stdout
    assert build_image.BOOT_LABEL in label

    # Slot A: owners and modes kept, the boot files only on the boot partition. Slot B: nothing yet.
    slot_a = f"{image}?offset={partitions[1]['start'] * 512}"
    stat = debugfs(slot_a, "stat /etc/appliance/gateway.toml")
    assert "Mode:  0640" in stat and f"User:     0   Group:   {APPLIANCE_UID}" in stat, stat
    assert debugfs(slot_a, "ls -l /boot/firmware").split().count("config.txt") == 0
    assert "usr/sbin" in debugfs(slot_a, "stat /sbin")
    with image.open("rb") as disk:
        disk.seek(partitions[2]["start"] * 512)
        assert disk.read(1024 * 1024).count(0) == 1024 * 1024

    # The data partition: the gateway's state directory and a copy of the shipped config.
    data_fs = f"{image}?offset={partitions[3]['start'] * 512}"
    state = debugfs(data_fs, "stat /appliance")
    assert "Mode:  0750" in state and f"User:   {APPLIANCE_UID}   Group:   {APPLIANCE_UID}" in state, state
    assert "Mode:  0640" in debugfs(data_fs, "stat /etc-appliance/gateway.toml")
    # RAUC's status file (the installed bundle's version) is read by the gateway itself, as its own user,
    # for the metrics page: the directory is the gateway's group's to enter, nobody else's; only root writes.
    rauc = debugfs(data_fs, "stat /rauc")
    assert "Mode:  0750" in rauc and f"User:     0   Group:   {APPLIANCE_UID}" in rauc, rauc
    assert build_image.DATA_LABEL in subprocess.run(["e2label", str(data)], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("systemd-tmpfiles") is None, reason="needs systemd")
def test_a_data_partition_made_root_only_by_an_older_image_is_opened_to_the_gateway_at_boot(tmp_path: Path) -> None:
    """The image's tmpfiles.d entry, applied by the real systemd-tmpfiles to a root whose ``/data/rauc`` is
    0700 root (as images before it made it): the gateway's group may then read RAUC's status file."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (root / "etc/group").write_text(f"root:x:0:\nappliance:x:{APPLIANCE_UID}:\n")
    (root / "data/rauc").mkdir(parents=True, mode=0o700)
    entries = IMAGE_ROOTFS / "etc/tmpfiles.d/appliance-rauc.conf"
    subprocess.run(["systemd-tmpfiles", "--create", f"--root={root}", str(entries)], check=True)
    found = (root / "data/rauc").stat()
    assert (found.st_mode & 0o777, found.st_uid, found.st_gid) == (0o750, 0, APPLIANCE_UID)
