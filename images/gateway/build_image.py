"""The flashable gateway image for Raspberry Pi 4/5: ``python images/gateway/build_image.py --wheel W``
(``make image``). Output: ``dist/gateway-<version>-arm64.img.zst``, its ``.sha256`` and ``.manifest``.

The root comes from ``build_root.py --arch arm64 --image`` (a Debian base under qemu-user emulation:
about 20 minutes of CPU on a 2-core machine, most of it mkinitramfs; cached like every root). This script
only assembles the disk, without loop devices, so it runs in a container or CI job that cannot mount:

* the boot partition: ``mkfs.vfat -C`` makes the FAT32 file system in a plain file, ``mcopy`` fills it
  with the root's ``/boot/firmware`` (firmware blobs, kernel, initrd, DTBs, ``config.txt``,
  ``cmdline.txt``: what the Pi's firmware reads);
* the root partition: ``mkfs.ext4 -d`` makes the ext4 file system from a directory (owners, modes and
  symlinks kept), with ``/boot/firmware`` left empty as the mount point;
* the disk: an ``sfdisk`` MBR table (the Pi 4 boot ROM reads MBR) in a sparse file, both file systems
  copied in with ``dd conv=notrunc,sparse``; then ``zstd``.

Partitions are found by label (``GW-BOOT``, ``gw-root``: ``image-rootfs/etc/fstab``, ``cmdline.txt``), so
the same image boots from an SD card or a USB disk. The root file system is its contents plus
``ROOT_SPARE_MB`` (the data directory's queues live there); it does not grow by itself to fill a larger
card (``growpart`` and ``resize2fs`` do that by hand).

The manifest lists every Debian package and version in the root and every wheel in the gateway's venv.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_root import build_root  # noqa: E402  (a script beside this one)

SECTOR = 512
#: The first partition starts at 8 MiB: aligned for SD cards' erase blocks.
FIRST_PARTITION_MB = 8
BOOT_MB = 256
#: Free room in the root file system beyond its contents (queues and databases under /var/lib/appliance).
ROOT_SPARE_MB = 1024
BOOT_LABEL, ROOT_LABEL = "GW-BOOT", "gw-root"
#: What the Pi 4 firmware needs on the boot partition; the build fails if one is missing.
PI4_BOOT_FILES = ("start4.elf", "fixup4.dat", "bcm2711-rpi-4-b.dtb", "config.txt", "cmdline.txt")
HOST_TOOLS = {
    "mmdebstrap": "mmdebstrap", "arch-test": "arch-test", "mkfs.vfat": "dosfstools", "mcopy": "mtools", "mkfs.ext4": "e2fsprogs",
    "sfdisk": "fdisk", "zstd": "zstd", "update-binfmts": "binfmt-support", "qemu-aarch64-static": "qemu-user-static",
}


def run(*command: str | Path) -> None:
    subprocess.run([str(part) for part in command], check=True)


def ensure_arm64_emulation() -> None:
    """qemu-user through binfmt_misc, so the arm64 chroot's maintainer scripts run on this machine."""
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    if not (binfmt / "register").exists():
        run("mount", "-t", "binfmt_misc", "binfmt_misc", binfmt)
    if not (binfmt / "qemu-aarch64").exists():
        run("update-binfmts", "--enable", "qemu-aarch64")


def missing_tools() -> list[str]:
    return sorted({package for tool, package in HOST_TOOLS.items() if shutil.which(tool) is None})


def boot_partition(boot_dir: Path, out: Path) -> None:
    missing = [name for name in PI4_BOOT_FILES if not (boot_dir / name).exists()]
    if missing:
        raise SystemExit(f"the boot partition would lack {', '.join(missing)}: raspi-firmware's hook did not run")
    run("mkfs.vfat", "-C", "-F", "32", "-n", BOOT_LABEL, out, str(BOOT_MB * 1024))
    run("mcopy", "-s", "-p", "-m", "-i", out, *sorted(boot_dir.iterdir()), "::")


def root_partition(root: Path, scratch: Path, out: Path) -> int:
    """The ext4 file system of ``root`` without the boot partition's files; returns its size in MiB."""
    staged = scratch / "rootfs"
    run("cp", "-a", "--reflink=auto", root, staged)
    for item in (staged / "boot/firmware").iterdir():
        shutil.rmtree(item) if item.is_dir() else item.unlink()
    used_kb = int(subprocess.run(["du", "-sk", str(staged)], check=True, capture_output=True, text=True).stdout.split()[0])
    size_mb = used_kb * 13 // 10 // 1024 + ROOT_SPARE_MB
    run("mkfs.ext4", "-q", "-L", ROOT_LABEL, "-d", staged, "-E", "root_owner=0:0", out, f"{size_mb}M")
    return size_mb


def disk(boot: Path, root: Path, root_mb: int, out: Path) -> None:
    boot_start = FIRST_PARTITION_MB * 1024 * 1024 // SECTOR
    boot_sectors = BOOT_MB * 1024 * 1024 // SECTOR
    root_start = boot_start + boot_sectors
    root_sectors = root_mb * 1024 * 1024 // SECTOR
    with out.open("wb") as image:
        image.truncate((root_start + root_sectors) * SECTOR)
    table = (
        "label: dos\nunit: sectors\n"
        f"start={boot_start}, size={boot_sectors}, type=c, bootable\n"
        f"start={root_start}, size={root_sectors}, type=83\n"
    )
    subprocess.run(["sfdisk", "--quiet", str(out)], input=table, text=True, check=True)
    for partition, start in ((boot, boot_start), (root, root_start)):
        run("dd", f"if={partition}", f"of={out}", f"seek={start}", f"bs={SECTOR}", "conv=notrunc,sparse", "status=none")


def manifest(root: Path, packages: Path) -> str:
    wheels = sorted(path.name for path in (root / "opt/appliance/wheels").glob("*.whl"))
    return (
        "# Debian packages (name, version, architecture)\n" + packages.read_text()
        + "\n# Wheels in /opt/appliance/venv\n" + "\n".join(wheels) + "\n"
    )


def build_image(wheel: Path, cache: Path, dist: Path) -> Path:
    version = re.match(r"appliance-([^-]+)-", wheel.name)
    if version is None:
        raise SystemExit(f"cannot read a version from {wheel.name}")
    missing = missing_tools()
    if missing:
        raise SystemExit(f"install first: apt-get install {' '.join(missing)} (make image does)")
    ensure_arm64_emulation()
    started = time.monotonic()
    root = build_root(wheel, "arm64", image=True, cache=cache)
    print(f"root: {root} ({time.monotonic() - started:.0f} s)")
    dist.mkdir(parents=True, exist_ok=True)
    name = f"gateway-{version.group(1)}-arm64.img"
    with tempfile.TemporaryDirectory(dir=cache, prefix="assemble-") as scratch_name:
        scratch = Path(scratch_name)
        boot_partition(root / "boot/firmware", scratch / "boot.vfat")
        root_mb = root_partition(root, scratch, scratch / "root.ext4")
        disk(scratch / "boot.vfat", scratch / "root.ext4", root_mb, scratch / name)
        compressed = dist / f"{name}.zst"
        run("zstd", "-q", "-f", "-T0", "-10", scratch / name, "-o", compressed)
    digest = hashlib.sha256(compressed.read_bytes()).hexdigest()
    (dist / f"{compressed.name}.sha256").write_text(f"{digest}  {compressed.name}\n")
    (dist / f"{name}.manifest").write_text(manifest(root, root.parent / "packages.txt"))
    print(f"{compressed} ({compressed.stat().st_size // (1024 * 1024)} MB) in {time.monotonic() - started:.0f} s")
    return compressed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the appliance wheel")
    parser.add_argument("--cache", type=Path, default=Path("build/image-root"), help="where roots are kept")
    parser.add_argument("--dist", type=Path, default=Path("dist"), help="where the image goes")
    args = parser.parse_args(argv)
    build_image(args.wheel, args.cache, args.dist)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
