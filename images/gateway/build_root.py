"""Build the gateway's root filesystem from Debian packages: ``python images/gateway/build_root.py --wheel W``.

One root, built one way, for two uses:

* ``--arch amd64`` (the build machine's own), no kernel: what ``make test-image`` boots with
  ``systemd-nspawn --boot`` (``tests/images/test_nspawn_boot.py``);
* ``--arch arm64 --image``: the same root plus a kernel, initramfs, the Raspberry Pi firmware, Wi-Fi
  firmware, NetworkManager and ModemManager; ``build_image.py`` turns it into the disk image.

Steps
-----
1. ``build_tree.py`` stages the layout every image gets (units enabled, ``/etc/appliance``, first-boot
   provisioning, the wheel, the docs); the pi-gen stage copies the same tree.
2. pip downloads the wheel's dependencies for the target (wheels only, ``--platform`` for arm64) into the
   tree's ``/opt/appliance/wheels``, so the chroot installs offline: no network and no CA bundle needed in
   it (a ``REQUESTS_CA_BUNDLE`` inherited from the host names a file the chroot does not have), and the
   image can rebuild its venv without the network.
3. ``mmdebstrap --variant=minbase`` builds the root from the Debian archive, copies the tree in and runs
   the pi-gen stage's own ``02-run-chroot.sh`` inside, with a clean environment and pip pointed at the
   wheels: the ``appliance`` user, ``/opt/appliance/venv``, the config checked, owners and modes.
   dpkg runs under eatmydata (no fsync while unpacking: the build is thrown away if it fails), and docs,
   man pages and locales are left out.

Cache
-----
A root is kept under ``<cache>/<arch>-<digest>/root`` where the digest covers every input: the wheel's
contents (not its zip timestamps), the staged tree, the package list, the suite and mirror, this file and
the chroot script. A finished root has a ``complete`` stamp beside it; anything else under the cache is an
interrupted build and is built again. ``packages.txt`` beside the root lists every package and version.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_tree import build_tree  # noqa: E402  (a script beside this one, not a package)

CHROOT_SCRIPT = HERE / "stage-gateway/00-gateway/02-run-chroot.sh"
#: Files only the flashable image gets: fstab by label, the Pi firmware's settings, the modem's udev rule,
#: NetworkManager's profiles from the boot partition.
IMAGE_ROOTFS = HERE / "image-rootfs"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
#: What every root needs: systemd as init (the units, sysusers, sd_notify), D-Bus (systemctl and logind
#: talk over it), the interpreter and venv for the gateway.
BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv")
#: What only the flashable image needs (``docs/hardware.md``, "The disk image").
IMAGE_PACKAGES = (
    "linux-image-arm64", "initramfs-tools", "raspi-firmware", "firmware-brcm80211", "wireless-regdb",
    "network-manager", "modemmanager", "systemd-timesyncd", "udev", "kmod", "iproute2", "e2fsprogs",
)
#: gpiozero's pin library on the Pi (lgpio: Pi 4 and Pi 5); off a Pi gpiozero finds none, and the gateway
#: runs without its panel.
IMAGE_WHEELS = ("lgpio",)
DEBIAN_ARCH_TO_PLATFORM = {"amd64": "x86_64", "arm64": "aarch64"}
#: bookworm's glibc is 2.36: any manylinux wheel up to that runs on it.
GLIBC_MINOR = 36
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)


def wheel_digest(wheel: Path) -> str:
    """The wheel's file names and contents: a rebuilt wheel of the same source has the same digest even
    though its zip entries carry new timestamps."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + b"\0" + hashlib.sha256(archive.read(name)).digest())
    return digest.hexdigest()


def tree_digest(tree: Path, skip: tuple[str, ...]) -> str:
    """Paths, modes, symlink targets and contents of a staged tree, except the paths under ``skip``."""
    digest = hashlib.sha256()
    for path in sorted(tree.rglob("*")):
        relative = path.relative_to(tree).as_posix()
        if relative.startswith(skip):
            continue
        mode = path.lstat().st_mode
        digest.update(f"{relative}\0{mode:o}\0".encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def packages(image: bool) -> list[str]:
    return [*BASE_PACKAGES, *(IMAGE_PACKAGES if image else ())]


def input_digest(wheel: Path, tree: Path, arch: str, image: bool) -> str:
    digest = hashlib.sha256()
    for part in (
        wheel_digest(wheel),
        tree_digest(tree, skip=("opt/appliance/wheels",)),
        arch, str(image), SUITE, MIRROR, " ".join(packages(image)), " ".join(IMAGE_WHEELS if image else ()),
        tree_digest(IMAGE_ROOTFS, skip=()) if image else "",
        hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        hashlib.sha256(CHROOT_SCRIPT.read_bytes()).hexdigest(),
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def download_wheels(wheel: Path, dest: Path, arch: str, image: bool) -> None:
    """The wheel's dependencies for ``arch`` and CPython 3.11 (bookworm's), wheels only."""
    platform = DEBIAN_ARCH_TO_PLATFORM[arch]
    platforms = ["--platform", f"manylinux2014_{platform}"]
    for minor in range(17, GLIBC_MINOR + 1):
        platforms += ["--platform", f"manylinux_2_{minor}_{platform}"]
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest), "--only-binary=:all:",
            "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
            *platforms, str(wheel), *(IMAGE_WHEELS if image else ()),
        ],
        check=True,
    )


def mmdebstrap_command(staged: Path, out: Path, arch: str, image: bool) -> list[str]:
    # The chroot runs the pi-gen step with nothing of the host's environment but a PATH, and pip offline.
    chroot_env = (
        "env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 PIP_NO_INDEX=1 PIP_NO_CACHE_DIR=1 "
        "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/opt/appliance/wheels"
    )
    command = [
        "mmdebstrap", "--variant=minbase", f"--arch={arch}", f"--include={','.join(packages(image))}",
        "--components=main,non-free-firmware" if image else "--components=main",
        "--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata",
        *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
        f"--customize-hook=sync-in {staged} /",
        f"--customize-hook=copy-in {CHROOT_SCRIPT} /tmp",
        f'--customize-hook=chroot "$1" {chroot_env} /bin/bash -e /tmp/{CHROOT_SCRIPT.name}',
        f'--customize-hook=rm "$1"/tmp/{CHROOT_SCRIPT.name}; mkdir -p "$1"/boot/firmware; echo gateway > "$1"/etc/hostname',
    ]
    if image:
        command += [
            f"--customize-hook=sync-in {IMAGE_ROOTFS} /",
            # gpiozero's pin library: not a dependency of the wheel (off a Pi there is nothing to drive).
            f'--customize-hook=chroot "$1" {chroot_env} /opt/appliance/venv/bin/pip install --quiet {" ".join(IMAGE_WHEELS)}',
            # The boot partition's contents: the firmware blobs, then the kernel hook once more now that
            # /etc/default/raspi-firmware is in place (during the package installs it found no settings, and
            # it does nothing at all unless DEB_MAINT_PARAMS says "configure"): kernel, initrd, DTBs,
            # config.txt and cmdline.txt.
            '--customize-hook=chroot "$1" sh -ec \'mkdir -p /boot/firmware; cp -r /usr/lib/raspi-firmware/* /boot/firmware/; '
            'for version in $(ls /lib/modules); do DEB_MAINT_PARAMS=configure /etc/kernel/postinst.d/z50-raspi-firmware "$version"; done\'',
        ]
    return [*command, SUITE, str(out), MIRROR]


def build_root(wheel: Path, arch: str, image: bool, cache: Path) -> Path:
    """The root for these inputs: from the cache, or built now (minutes). Returns ``<cache>/<key>/root``."""
    cache = cache.resolve()  # mmdebstrap's hooks do not run where this does
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="stage-") as scratch:
        staged = Path(scratch) / "tree"
        build_tree(wheel, staged, host_venv=False)
        key = f"{arch}{'-image' if image else ''}-{input_digest(wheel, staged, arch, image)}"
        done = cache / key
        if (done / "complete").exists():
            return done / "root"
        shutil.rmtree(done, ignore_errors=True)
        started = time.monotonic()
        download_wheels(wheel, staged / "opt/appliance/wheels", arch, image)
        building = Path(scratch) / "build"
        building.mkdir()
        subprocess.run(mmdebstrap_command(staged, building / "root", arch, image), check=True)
        listing = subprocess.run(
            ["dpkg-query", f"--admindir={building / 'root/var/lib/dpkg'}", "-W", "-f", "${Package}\t${Version}\t${Architecture}\n"],
            check=True, capture_output=True, text=True,
        ).stdout
        (building / "packages.txt").write_text("".join(sorted(listing.splitlines(keepends=True))))
        (building / "complete").write_text(f"built in {time.monotonic() - started:.0f} s\n")
        building.rename(done)
    # Older roots of this kind are superseded: keep the cache from growing by one root per commit.
    for old in cache.glob(f"{key.rsplit('-', 1)[0]}-*"):
        if old != done and old.name.rsplit("-", 1)[0] == key.rsplit("-", 1)[0]:
            shutil.rmtree(old, ignore_errors=True)
    return done / "root"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the appliance wheel")
    parser.add_argument("--arch", default="amd64", choices=sorted(DEBIAN_ARCH_TO_PLATFORM), help="Debian architecture")
    parser.add_argument("--image", action="store_true", help="add kernel, firmware and the uplink stack (disk image)")
    parser.add_argument("--cache", type=Path, default=Path("build/image-root"), help="where roots are kept")
    args = parser.parse_args(argv)
    print(build_root(args.wheel, args.arch, args.image, args.cache))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
