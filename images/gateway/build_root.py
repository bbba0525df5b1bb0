"""Build the gateway's root filesystem from Debian packages: ``python images/gateway/build_root.py --wheel W``.

One root, built one way, for two uses:

* ``--arch amd64`` (the build machine's own), no kernel: what ``make test-image`` boots with
  ``systemd-nspawn --boot`` (``tests/images/test_nspawn_boot.py``);
* ``--arch arm64 --image``: the same root plus a kernel, initramfs, the Raspberry Pi firmware, Wi-Fi
  firmware, NetworkManager and ModemManager; ``build_image.py`` turns it into the disk image.

Two layers
----------
1. The Debian base (``build_base.py``): every package, nothing of the gateway, cached by the digest of the
   package list alone. It is the slow part (the arm64 one runs dpkg and mkinitramfs under qemu-user), so
   a change to the gateway's code never rebuilds it.
2. The gateway, on a copy of that base (seconds to a minute):

   a. ``build_tree.py`` stages the layout every image gets (units enabled, ``/etc/appliance``, first-boot
      provisioning, the wheel, the docs); the pi-gen stage copies the same tree.
   b. pip downloads the wheel's dependencies for the target (wheels only, ``--platform`` for arm64) into
      the tree's ``/opt/appliance/wheels``, so the chroot installs offline: no network and no CA bundle
      needed in it (a ``REQUESTS_CA_BUNDLE`` inherited from the host names a file the chroot does not
      have), and the image can rebuild its venv without the network.
   c. The tree is copied in and the pi-gen stage's own ``02-run-chroot.sh`` runs inside, with a clean
      environment and pip pointed at the wheels: the ``appliance`` user, ``/opt/appliance/venv``, the
      config checked, owners and modes. For the image: ``image-rootfs/``, ``lgpio`` in the venv and the
      Raspberry Pi firmware's kernel hook (kernel, initrd, DTBs, ``config.txt``, ``cmdline.txt`` on
      ``/boot/firmware``).

   The chroot is entered from a private mount namespace (``unshare --mount``) with ``/proc`` and ``/dev``
   mounted in it, so nothing stays mounted when a step fails. An arm64 chroot runs through qemu-user's
   binfmt_misc entry (``F`` flag: the interpreter need not be inside the root).

Cache
-----
A root is kept under ``<cache>/<arch>[-image]-<digest>/root`` where the digest covers the base's key and
every input of the layer: the wheel's contents (not its zip timestamps), the staged tree, the image's
files, this file and the chroot script. A finished root has a ``complete`` stamp beside it; anything else
under the cache is an interrupted build and is built again. ``packages.txt`` beside the root lists every
package and version (the base's).
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
from build_base import build_base, drop_superseded  # noqa: E402  (scripts beside this one, not a package)
from build_tree import build_tree  # noqa: E402

CHROOT_SCRIPT = HERE / "stage-gateway/00-gateway/02-run-chroot.sh"
#: Files only the flashable image gets: fstab by label, the Pi firmware's settings, the modem's udev rule,
#: NetworkManager's profiles from the boot partition.
IMAGE_ROOTFS = HERE / "image-rootfs"
#: gpiozero's pin library on the Pi (lgpio: Pi 4 and Pi 5); off a Pi gpiozero finds none, and the gateway
#: runs without its panel.
IMAGE_WHEELS = ("lgpio",)
DEBIAN_ARCH_TO_PLATFORM = {"amd64": "x86_64", "arm64": "aarch64"}
#: bookworm's glibc is 2.36: any manylinux wheel up to that runs on it.
GLIBC_MINOR = 36
#: The chroot's steps run with nothing of the host's environment but a PATH, and pip offline.
CHROOT_ENV = (
    "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "PIP_NO_INDEX=1", "PIP_NO_CACHE_DIR=1",
    "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_FIND_LINKS=/opt/appliance/wheels",
)
#: The boot partition's kernel, initrd, DTBs, ``config.txt`` and ``cmdline.txt``, written by
#: raspi-firmware's kernel hook now that ``/etc/default/raspi-firmware`` is in place (during the package
#: installs it found no settings, and it does nothing at all unless DEB_MAINT_PARAMS says "configure").
RASPI_FIRMWARE_HOOK = (
    'for version in $(ls /lib/modules); do DEB_MAINT_PARAMS=configure /etc/kernel/postinst.d/z50-raspi-firmware "$version"; done'
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


def layer_digest(base: str, wheel: Path, tree: Path, image: bool, keyring: Path | None) -> str:
    digest = hashlib.sha256()
    for part in (
        base,
        hashlib.sha256(keyring.read_bytes()).hexdigest() if keyring is not None else "",
        wheel_digest(wheel),
        tree_digest(tree, skip=("opt/appliance/wheels",)),
        " ".join(IMAGE_WHEELS if image else ()),
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


def in_chroot(root: Path, *command: str) -> None:
    """``command`` inside ``root`` with the chroot environment, ``/proc`` and ``/dev`` mounted in a private
    mount namespace that ends with it."""
    mounts = 'mount -t proc proc "$0/proc" && mount --rbind /dev "$0/dev" && exec chroot "$0" "$@"'
    subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts, str(root), *CHROOT_ENV, *command], check=True)


def install_gateway(root: Path, staged: Path, image: bool, keyring: Path | None) -> None:
    """The layer: the staged tree, the chroot step, and for the image its own files, the update keyring,
    the kernel where the boot script loads it and the boot partition."""
    subprocess.run(["cp", "-a", f"{staged}/.", f"{root}/"], check=True)
    shutil.copy(CHROOT_SCRIPT, root / "tmp" / CHROOT_SCRIPT.name)
    in_chroot(root, "/bin/bash", "-e", f"/tmp/{CHROOT_SCRIPT.name}")
    (root / "tmp" / CHROOT_SCRIPT.name).unlink()
    (root / "boot/firmware").mkdir(parents=True, exist_ok=True)
    (root / "etc/hostname").write_text("gateway\n")
    if image:
        subprocess.run(["cp", "-a", f"{IMAGE_ROOTFS}/.", f"{root}/"], check=True)
        # gpiozero's pin library: not a dependency of the wheel (off a Pi there is nothing to drive).
        in_chroot(root, "/opt/appliance/venv/bin/pip", "install", "--quiet", *IMAGE_WHEELS)
        in_chroot(root, "/bin/sh", "-ec", RASPI_FIRMWARE_HOOK)
        # U-Boot's boot script loads /boot/vmlinuz and /boot/initrd.img from the slot it boots.
        [kernel] = sorted((root / "boot").glob("vmlinuz-*"))
        version = kernel.name.removeprefix("vmlinuz-")
        for link, target in (("vmlinuz", kernel.name), ("initrd.img", f"initrd.img-{version}")):
            (root / "boot" / link).unlink(missing_ok=True)
            (root / "boot" / link).symlink_to(target)
        (root / "data").mkdir(exist_ok=True)  # the data partition's mount point
        if keyring is None:
            raise ValueError("the image needs the update keyring")
        shutil.copy(keyring, root / "etc/rauc/keyring.pem")


def build_root(wheel: Path, arch: str, image: bool, cache: Path, keyring: Path | None = None) -> Path:
    """The root for these inputs: from the cache, or built now on the cached (or newly built) Debian base.
    ``keyring`` (the image only) is the certificate RAUC checks update bundles against. Returns
    ``<cache>/<key>/root``."""
    cache = cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    base = build_base(arch, image, cache)
    with tempfile.TemporaryDirectory(dir=cache, prefix="stage-") as scratch:
        staged = Path(scratch) / "tree"
        build_tree(wheel, staged, host_venv=False)
        key = f"{arch}{'-image' if image else ''}-{layer_digest(base.name, wheel, staged, image, keyring)}"
        done = cache / key
        if (done / "complete").exists():
            return done / "root"
        shutil.rmtree(done, ignore_errors=True)
        started = time.monotonic()
        download_wheels(wheel, staged / "opt/appliance/wheels", arch, image)
        building = Path(scratch) / "build"
        building.mkdir()
        subprocess.run(["cp", "-a", str(base / "root"), str(building / "root")], check=True)
        install_gateway(building / "root", staged, image, keyring)
        shutil.copy(base / "packages.txt", building / "packages.txt")
        (building / "complete").write_text(f"built in {time.monotonic() - started:.0f} s on {base.name}\n")
        building.rename(done)
    # Older roots of this kind are superseded: keep the cache from growing by one root per commit.
    drop_superseded(cache, key)
    return done / "root"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the appliance wheel")
    parser.add_argument("--arch", default="amd64", choices=sorted(DEBIAN_ARCH_TO_PLATFORM), help="Debian architecture")
    parser.add_argument("--image", action="store_true", help="add kernel, firmware and the uplink stack (disk image)")
    parser.add_argument("--cache", type=Path, default=Path("build/image-root"), help="where roots are kept")
    parser.add_argument("--keyring", type=Path, help="the update bundles' signing certificate (with --image)")
    args = parser.parse_args(argv)
    print(build_root(args.wheel, args.arch, args.image, args.cache, args.keyring))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
