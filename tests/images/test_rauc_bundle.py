"""``build_bundle.py``: signed RAUC bundles checked by the real ``rauc`` against the keyring the image carries.

``rauc info --keyring`` runs the same CMS verification ``rauc install`` does before it writes a slot, so
a bundle refused here is refused on the gateway. The root file system in the bundle is a small ext4 made
with ``mkfs.ext4 -d`` (random contents: RAUC refuses a squashfs of a single block).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(PROJECT / "images/gateway"))
import build_bundle  # noqa: E402  (a script beside the image's other build scripts)

pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("rauc", "mksquashfs", "mkfs.ext4", "openssl")),
    reason="rauc, squashfs-tools, e2fsprogs and openssl are needed (make system-deps installs them)",
)


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "noise").write_bytes(os.urandom(256 * 1024))
    image = tmp_path / "rootfs.ext4"
    subprocess.run(["mkfs.ext4", "-q", "-d", str(tree), str(image), "4M"], check=True, capture_output=True)
    return image


def rauc_info(bundle: Path, keyring: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rauc", "info", f"--keyring={keyring}", str(bundle)], capture_output=True, text=True)


def test_the_key_pair_is_made_once_and_the_private_key_is_the_owners_alone(tmp_path: Path) -> None:
    cert, key = build_bundle.dev_keys(tmp_path / "keys")
    assert key.stat().st_mode & 0o777 == 0o600
    first = cert.read_bytes()
    assert build_bundle.dev_keys(tmp_path / "keys") == (cert, key)
    assert cert.read_bytes() == first  # not made again: bundles signed earlier still verify


def test_a_bundle_verifies_against_the_images_keyring_with_its_version(tmp_path: Path, rootfs: Path) -> None:
    cert, key = build_bundle.dev_keys(tmp_path / "keys")
    bundle = build_bundle.build_bundle(rootfs, "2.0.0", tmp_path / "v2.raucb", cert, key)
    info = rauc_info(bundle, cert)
    assert info.returncode == 0, info.stderr
    assert f"'{build_bundle.COMPATIBLE}'" in info.stdout and "'2.0.0'" in info.stdout
    assert "verity" in info.stdout


def test_a_bundle_signed_with_another_key_is_refused(tmp_path: Path, rootfs: Path) -> None:
    cert, _ = build_bundle.dev_keys(tmp_path / "keys")
    other_cert, other_key = build_bundle.dev_keys(tmp_path / "other", name="somebody else")
    bundle = build_bundle.build_bundle(rootfs, "2.0.0", tmp_path / "other.raucb", other_cert, other_key)
    assert rauc_info(bundle, other_cert).returncode == 0  # a good bundle, only not ours
    refused = rauc_info(bundle, cert)
    assert refused.returncode != 0
    assert "signature verification failed" in refused.stderr, refused.stderr


def test_a_bundle_changed_after_signing_is_refused(tmp_path: Path, rootfs: Path) -> None:
    cert, key = build_bundle.dev_keys(tmp_path / "keys")
    bundle = build_bundle.build_bundle(rootfs, "2.0.0", tmp_path / "v2.raucb", cert, key)
    data = bytearray(bundle.read_bytes())
    # The CMS signature sits between the squashfs and the trailing 8-byte size: change a byte in it.
    data[-300] ^= 0x01
    bundle.write_bytes(bytes(data))
    refused = rauc_info(bundle, cert)
    assert refused.returncode != 0, refused.stdout
