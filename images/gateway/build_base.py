"""The Debian base of the gateway's root: every package from the archive, nothing of the gateway.

``build_root.py`` layers the gateway (its tree, its venv, the image's own files) on a copy of this base.
The base is the slow part (minutes natively; for the arm64 image about an hour of wall time under
qemu-user, most of it mkinitramfs), and it changes only when the package list, the suite or this file
changes, never with the gateway's code: so it is cached by a digest of those inputs alone, and a commit
that touches only the gateway rebuilds only the layer.

``mmdebstrap --variant=minbase`` builds it from the Debian archive. dpkg runs under eatmydata (no fsync
while unpacking: a failed build is thrown away), and docs, man pages and locales are left out. For the
image it also holds the kernel, its initramfs and the Raspberry Pi firmware blobs copied to
``/boot/firmware`` (the kernel hook that writes ``config.txt`` and ``cmdline.txt`` needs the image's
``/etc/default/raspi-firmware`` and runs in the layer).

Cache: ``<cache>/base/<arch>[-image]-<digest>/root``, a ``complete`` stamp and ``packages.txt`` (every
package and version) beside it; a directory without the stamp is an interrupted build and is built again.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
#: What every root needs: systemd as init (the units, sysusers, sd_notify), D-Bus (systemctl and logind
#: talk over it), the interpreter and venv for the gateway.
BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv")
#: What only the flashable image needs (``docs/hardware.md``, "The disk image").
IMAGE_PACKAGES = (
    "linux-image-arm64", "initramfs-tools", "raspi-firmware", "firmware-brcm80211", "wireless-regdb",
    "network-manager", "modemmanager", "systemd-timesyncd", "udev", "kmod", "iproute2", "e2fsprogs",
    # A/B updates: RAUC (the CLI; ``rauc-service`` is its D-Bus service, without which ``rauc install`` and
    # ``rauc status mark-good`` fail: "The name de.pengutronix.rauc was not provided by any .service files"),
    # U-Boot's environment tools, U-Boot for the Pi.
    "rauc", "rauc-service", "u-boot-tools", "u-boot-rpi",
)
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)


def packages(image: bool) -> list[str]:
    return [*BASE_PACKAGES, *(IMAGE_PACKAGES if image else ())]


def base_key(arch: str, image: bool) -> str:
    """``<arch>[-image]-<digest>``: the digest covers what goes into the base and nothing else."""
    digest = hashlib.sha256()
    for part in (arch, str(image), SUITE, MIRROR, " ".join(packages(image)), hashlib.sha256(Path(__file__).read_bytes()).hexdigest()):
        digest.update(part.encode() + b"\0")
    return f"{arch}{'-image' if image else ''}-{digest.hexdigest()[:16]}"


def mmdebstrap_command(out: Path, arch: str, image: bool) -> list[str]:
    command = [
        "mmdebstrap", "--variant=minbase", f"--arch={arch}", f"--include={','.join(packages(image))}",
        "--components=main,non-free-firmware" if image else "--components=main",
        "--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata",
        *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
    ]
    if image:
        # The firmware blobs the Pi's boot ROM and GPU read; the layer adds kernel, initrd, DTBs and the
        # two text files through the package's kernel hook.
        command.append('--customize-hook=mkdir -p "$1"/boot/firmware; cp -r "$1"/usr/lib/raspi-firmware/. "$1"/boot/firmware/')
    return [*command, SUITE, str(out), MIRROR]


def package_listing(root: Path) -> str:
    listing = subprocess.run(
        ["dpkg-query", f"--admindir={root / 'var/lib/dpkg'}", "-W", "-f", "${Package}\t${Version}\t${Architecture}\n"],
        check=True, capture_output=True, text=True,
    ).stdout
    return "".join(sorted(listing.splitlines(keepends=True)))


def drop_superseded(cache: Path, key: str) -> None:
    """Older entries of the same kind (``<kind>-<digest>``) go: the cache keeps one per kind."""
    kind = key.rsplit("-", 1)[0]
    for old in cache.glob(f"{kind}-*"):
        if old.name != key and old.name.rsplit("-", 1)[0] == kind:
            shutil.rmtree(old, ignore_errors=True)


def build_base(arch: str, image: bool, cache: Path) -> Path:
    """The base root for ``arch``: from the cache, or built now. Returns ``<cache>/base/<key>``."""
    bases = cache.resolve() / "base"  # mmdebstrap's hooks do not run where this does
    bases.mkdir(parents=True, exist_ok=True)
    key = base_key(arch, image)
    done = bases / key
    if (done / "complete").exists():
        return done
    shutil.rmtree(done, ignore_errors=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=bases, prefix="building-") as scratch:
        building = Path(scratch) / key
        building.mkdir()
        subprocess.run(mmdebstrap_command(building / "root", arch, image), check=True)
        (building / "packages.txt").write_text(package_listing(building / "root"))
        (building / "complete").write_text(f"built in {time.monotonic() - started:.0f} s\n")
        building.rename(done)
    drop_superseded(bases, key)
    return done
