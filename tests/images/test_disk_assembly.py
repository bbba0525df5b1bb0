"""``build_image.py``'s disk assembly on a small stand-in root, with the real tools (mkfs.vfat, mcopy,
mkfs.ext4 -d, sfdisk, dd) and read back with others (sfdisk --json, mtools, debugfs): the partition table,
the boot partition's files, the root's owners and modes, and the boot files kept out of the root."""

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

TOOLS = ("mkfs.vfat", "mcopy", "mtype", "mkfs.ext4", "debugfs", "sfdisk")
pytestmark = [
    pytest.mark.skipif(any(shutil.which(tool) is None for tool in TOOLS), reason="needs dosfstools, mtools, e2fsprogs, fdisk"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a root's owners can only be staged as root"),
]


def stand_in_root(root: Path) -> None:
    boot = root / "boot/firmware"
    boot.mkdir(parents=True)
    for name in build_image.PI4_BOOT_FILES:
        (boot / name).write_text(f"{name}\n")
    (boot / "overlays").mkdir()
    (boot / "overlays/disable-bt.dtbo").write_bytes(b"\xd0\x0d\xfe\xed")
    config = root / "etc/appliance"
    config.mkdir(parents=True)
    (config / "gateway.toml").write_text("[gateway]\n")
    os.chown(config / "gateway.toml", 0, 996)
    (config / "gateway.toml").chmod(0o640)
    (root / "opt/appliance/wheels").mkdir(parents=True)
    (root / "sbin").symlink_to("usr/sbin")


def test_a_disk_from_a_root_has_the_pi_boot_partition_and_the_root_by_label(tmp_path: Path) -> None:
    root = tmp_path / "root"
    stand_in_root(root)
    boot, ext4, image = tmp_path / "boot.vfat", tmp_path / "root.ext4", tmp_path / "disk.img"
    build_image.boot_partition(root / "boot/firmware", boot)
    root_mb = build_image.root_partition(root, tmp_path, ext4)
    build_image.disk(boot, ext4, root_mb, image)

    table = json.loads(subprocess.run(["sfdisk", "--json", str(image)], capture_output=True, text=True, check=True).stdout)
    first, second = table["partitiontable"]["partitions"]
    assert table["partitiontable"]["label"] == "dos"
    assert (first["start"], first["type"], first.get("bootable")) == (16384, "c", True)
    assert second["start"] == first["start"] + first["size"] and second["type"] == "83"

    # The boot partition as the Pi's firmware reads it: FAT at the first partition's offset.
    offset = f"{image}@@{first['start'] * 512}"
    config = subprocess.run(["mtype", "-i", offset, "::config.txt"], capture_output=True, text=True, check=True).stdout
    assert config == "config.txt\n"
    listing = subprocess.run(["mdir", "-b", "-i", offset, "::overlays"], capture_output=True, text=True, check=True).stdout
    assert "disable-bt.dtbo" in listing
    label = subprocess.run(["mlabel", "-s", "-i", offset, "::"], capture_output=True, text=True, check=True).stdout
    assert build_image.BOOT_LABEL in label

    # The root partition: owners and modes kept, the boot files only on the boot partition.
    def debugfs(request: str) -> str:
        return subprocess.run(["debugfs", "-R", request, str(ext4)], capture_output=True, text=True, check=True).stdout

    stat = debugfs("stat /etc/appliance/gateway.toml")
    assert "Mode:  0640" in stat and "User:     0   Group:   996" in stat, stat
    assert debugfs("ls -l /boot/firmware").split().count("config.txt") == 0
    assert "usr/sbin" in debugfs("stat /sbin")
    assert build_image.ROOT_LABEL in subprocess.run(["e2label", str(ext4)], capture_output=True, text=True, check=True).stdout
