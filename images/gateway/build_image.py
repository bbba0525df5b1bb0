"""The flashable gateway image for Raspberry Pi 4/5: ``python images/gateway/build_image.py --wheel W``
(``make image``). Output: ``dist/gateway-<version>-arm64.img.zst``, its ``.sha256`` and ``.manifest``.

The root comes from ``build_root.py --arch arm64 --image`` (a Debian base under qemu-user emulation:
about 20 minutes of CPU on a 2-core machine, most of it mkinitramfs; cached like every root). This script
only assembles the disk, without loop devices, so it runs in a container or CI job that cannot mount:

* the boot partition: ``mkfs.vfat -C`` makes the FAT32 file system in a plain file, ``mcopy`` fills it
  with what the Pi's firmware reads from the root's ``/boot/firmware`` (firmware blobs, DTBs, overlays,
  ``config.txt`` starting U-Boot, ``cmdline.txt``), U-Boot for the Pi and the A/B boot script ``boot.scr``;
  the kernel and initramfs stay in the slot, which the boot script loads them from;
* slot A and the data partition: ``mkfs.ext4 -d`` makes each ext4 file system from a directory (owners,
  modes and symlinks kept); slot B stays empty until the first update;
* the disk: an ``sfdisk`` MBR table (the Pi 4 boot ROM reads MBR) in a sparse file, the file systems
  copied in with ``dd conv=notrunc,sparse``; then ``zstd``. The same slot file goes into the RAUC bundle.

Partitions are found by the disk identifier (``root=PARTUUID=47617465-0N`` from the boot script, RAUC's
``system.conf``) and by label (``GW-BOOT``, ``gw-data``: ``image-rootfs/etc/fstab``), so the same image
boots from an SD card, a USB disk or QEMU's virtio disk. The partitions are fixed-size (the sizes below);
nothing grows them to fill a larger card.

The manifest lists every Debian package and version in the root and every wheel in the gateway's venv.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_bundle import build_bundle, dev_keys  # noqa: E402  (scripts beside this one)
from build_root import build_root  # noqa: E402

SECTOR = 512
#: The first partition starts at 8 MiB: aligned for SD cards' erase blocks.
FIRST_PARTITION_MB = 8
BOOT_MB = 256
#: Each root slot: what a root may grow to across updates (the bundle's ext4 is exactly this size).
SLOT_MB = 2048
#: The data partition (``/data``: the gateway's queues and databases, its provisioned config, RAUC's status).
DATA_MB = 1024
BOOT_LABEL, DATA_LABEL = "GW-BOOT", "gw-data"
#: The MBR disk identifier: partitions are ``PARTUUID=47617465-0N`` ("Gate"), named so in system.conf.
DISK_ID = 0x47617465
#: What the Pi 4 firmware needs on the boot partition; the build fails if one is missing.
PI4_BOOT_FILES = ("start4.elf", "fixup4.dat", "bcm2711-rpi-4-b.dtb", "config.txt", "cmdline.txt")
#: U-Boot for the Pi (the firmware starts it as its "kernel") and the A/B boot script both machines run.
PI_UBOOT = "usr/lib/u-boot/rpi_arm64/u-boot.bin"
BOOT_SCRIPT = HERE / "uboot/boot.cmd"
HOST_TOOLS = {
    "mmdebstrap": "mmdebstrap", "arch-test": "arch-test", "mkfs.vfat": "dosfstools", "mcopy": "mtools", "mkfs.ext4": "e2fsprogs",
    "sfdisk": "fdisk", "zstd": "zstd", "update-binfmts": "binfmt-support", "qemu-aarch64-static": "qemu-user-static",
    "mkimage": "u-boot-tools", "rauc": "rauc", "mksquashfs": "squashfs-tools", "openssl": "openssl",
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


def boot_script(out: Path) -> None:
    """``boot.scr``: the A/B boot script wrapped for U-Boot's ``source`` (what distro boot looks for)."""
    run("mkimage", "-q", "-A", "arm64", "-O", "linux", "-T", "script", "-C", "none", "-n", "gateway A/B", "-d", BOOT_SCRIPT, out)


def boot_partition(root: Path, scratch: Path, out: Path) -> None:
    """The FAT boot partition: the Pi firmware and device trees, U-Boot as the Pi firmware's "kernel"
    (``config.txt``), and ``boot.scr``; kernel and initrd are read from the slot, not from here."""
    boot_dir = root / "boot/firmware"
    missing = [name for name in PI4_BOOT_FILES if not (boot_dir / name).exists()]
    if missing:
        raise SystemExit(f"the boot partition would lack {', '.join(missing)}: raspi-firmware's hook did not run")
    if not (root / PI_UBOOT).exists():
        raise SystemExit(f"the root lacks /{PI_UBOOT} (u-boot-rpi)")
    boot_script(scratch / "boot.scr")
    shutil.copy(root / PI_UBOOT, scratch / "u-boot.bin")
    # The kernel and initrd stay in the slots (an update brings its own); the Pi firmware starts U-Boot.
    files = [path for path in sorted(boot_dir.iterdir()) if not path.name.startswith(("vmlinuz-", "initrd.img-"))]
    config = (boot_dir / "config.txt").read_text()
    config = "".join(line for line in config.splitlines(keepends=True) if not line.startswith(("kernel=", "initramfs ")))
    config += "\n# The A/B boot selector: U-Boot runs boot.scr (images/gateway/README.md).\nkernel=u-boot.bin\n"
    (scratch / "config.txt").write_text(config)
    files = [path for path in files if path.name != "config.txt"] + [scratch / name for name in ("config.txt", "u-boot.bin", "boot.scr")]
    run("mkfs.vfat", "-C", "-F", "32", "-n", BOOT_LABEL, out, str(BOOT_MB * 1024))
    run("mcopy", "-s", "-p", "-m", "-i", out, *files, "::")


def slot_image(root: Path, scratch: Path, out: Path) -> None:
    """The ext4 file system of one root slot, ``SLOT_MB``: the root without the boot partition's files
    and with empty mount points for the data partition's binds. The same file goes into slot A of the
    disk and into the update bundle."""
    staged = scratch / "rootfs"
    run("cp", "-a", "--reflink=auto", root, staged)
    for item in (staged / "boot/firmware").iterdir():
        shutil.rmtree(item) if item.is_dir() else item.unlink()
    used_kb = int(subprocess.run(["du", "-sk", str(staged)], check=True, capture_output=True, text=True).stdout.split()[0])
    if used_kb * 13 // 10 // 1024 > SLOT_MB:
        raise SystemExit(f"the root ({used_kb // 1024} MiB) does not fit a {SLOT_MB} MiB slot with room to spare")
    run("mkfs.ext4", "-q", "-d", staged, "-E", "root_owner=0:0", out, f"{SLOT_MB}M")
    shutil.rmtree(staged)


def data_partition(root: Path, scratch: Path, out: Path) -> None:
    """``/data``: ``appliance/`` (bound on ``/var/lib/appliance``, owned by the gateway's user),
    ``etc-appliance/`` (bound on ``/etc/appliance``: the shipped config, provisioned at first boot),
    ``rauc/`` (RAUC's status: root writes it, the gateway's group reads the installed version from it for
    the metrics page, which the gateway serves as its own user); ``network-connections/`` (NetworkManager's profiles) is made at boot by
    ``tmpfiles.d/appliance-network.conf``, also on a data partition older than it. Outside both slots: an
    update or a fallback leaves it as it is."""
    staged = scratch / "data"
    staged.mkdir()
    uid = gid = None
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == "appliance":
            uid, gid = int(fields[2]), int(fields[3])
    if uid is None or gid is None:
        raise SystemExit("the root has no appliance user")
    (staged / "appliance").mkdir(mode=0o750)
    os.chown(staged / "appliance", uid, gid)
    run("cp", "-a", root / "etc/appliance", staged / "etc-appliance")
    (staged / "rauc").mkdir(mode=0o750)
    os.chown(staged / "rauc", 0, gid)
    run("mkfs.ext4", "-q", "-L", DATA_LABEL, "-d", staged, "-E", "root_owner=0:0", out, f"{DATA_MB}M")


def disk(boot: Path, slot_a: Path, data: Path, out: Path) -> None:
    """Four primary MBR partitions (the Pi 4 boot ROM reads MBR): boot, slot A, slot B (empty until the
    first update), data."""
    sizes = (BOOT_MB, SLOT_MB, SLOT_MB, DATA_MB)
    starts = []
    start = FIRST_PARTITION_MB * 1024 * 1024 // SECTOR
    for size_mb in sizes:
        starts.append(start)
        start += size_mb * 1024 * 1024 // SECTOR
    with out.open("wb") as image:
        image.truncate(start * SECTOR)
    types = ("c", "83", "83", "83")
    table = f"label: dos\nlabel-id: {DISK_ID:#x}\nunit: sectors\n" + "".join(
        f"start={first}, size={size_mb * 1024 * 1024 // SECTOR}, type={kind}{', bootable' if kind == 'c' else ''}\n"
        for first, size_mb, kind in zip(starts, sizes, types, strict=True)
    )
    subprocess.run(["sfdisk", "--quiet", str(out)], input=table, text=True, check=True)
    for partition, first in ((boot, starts[0]), (slot_a, starts[1]), (data, starts[3])):
        run("dd", f"if={partition}", f"of={out}", f"seek={first}", f"bs={SECTOR}", "conv=notrunc,sparse", "status=none")


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
    cert, key = dev_keys()
    root = build_root(wheel, "arm64", image=True, cache=cache, keyring=cert)
    print(f"root: {root} ({time.monotonic() - started:.0f} s)")
    dist.mkdir(parents=True, exist_ok=True)
    name = f"gateway-{version.group(1)}-arm64.img"
    with tempfile.TemporaryDirectory(dir=cache, prefix="assemble-") as scratch_name:
        scratch = Path(scratch_name)
        boot_partition(root, scratch, scratch / "boot.vfat")
        slot_image(root, scratch, scratch / "rootfs.ext4")
        data_partition(root, scratch, scratch / "data.ext4")
        disk(scratch / "boot.vfat", scratch / "rootfs.ext4", scratch / "data.ext4", scratch / name)
        compressed = dist / f"{name}.zst"
        run("zstd", "-q", "-f", "-T0", "-10", scratch / name, "-o", compressed)
        bundle = build_bundle(scratch / "rootfs.ext4", version.group(1), dist / f"gateway-{version.group(1)}-arm64.raucb", cert, key)
    digest = hashlib.sha256(compressed.read_bytes()).hexdigest()
    (dist / f"{compressed.name}.sha256").write_text(f"{digest}  {compressed.name}\n")
    (dist / f"{name}.manifest").write_text(manifest(root, root.parent / "packages.txt"))
    print(f"{compressed} ({compressed.stat().st_size // (1024 * 1024)} MB) and {bundle.name} "
          f"({bundle.stat().st_size // (1024 * 1024)} MB) in {time.monotonic() - started:.0f} s")
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
