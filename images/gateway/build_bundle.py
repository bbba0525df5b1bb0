"""Signed RAUC update bundles for the gateway's A/B root slots, and the development key pair that signs them.

``python images/gateway/build_bundle.py --rootfs R --version V --out B`` wraps the root file system image
``R`` (ext4, the same one the disk image's slots are made of) in a RAUC bundle:

* the manifest names the compatible string the image's ``/etc/rauc/system.conf`` carries
  (``COMPATIBLE``), so a bundle for another product is refused before anything is written, and the
  version, which ``rauc status`` and ``appliance doctor`` show for the slot it lands in;
* ``format=verity``: the bundle's squashfs is checked block by block against a signed dm-verity hash tree
  while it is installed, so a bundle changed after signing is refused, and it can be streamed;
* it is signed (CMS) with the key in ``build/rauc-keys/``; the image carries only the certificate, as its
  keyring (``/etc/rauc/keyring.pem``), and refuses bundles signed by any other key.

Keys: ``dev_keys()`` makes a self-signed development key pair under ``build/`` the first time (never
committed: ``build/`` is not tracked). A product would sign with a key kept offline or in an HSM
(``--key pkcs11:...``) and put its CA, not the signing certificate, in the keyring.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

#: The product and architecture a bundle is for: ``compatible`` in system.conf and in every manifest.
COMPATIBLE = "appliance-gateway-arm64"
KEY_DIR = Path("build/rauc-keys")


def dev_keys(directory: Path = KEY_DIR, name: str = "gateway development update key") -> tuple[Path, Path]:
    """``(certificate, key)`` in ``directory``, made now if absent: RSA 3072, self-signed, ten years. No
    extended key usage: RAUC checks the signer for the S/MIME signing purpose, which ``codeSigning`` alone
    fails ("unsuitable certificate purpose")."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    if cert.exists() and key.exists():
        return cert, key
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:3072", "-nodes", "-keyout", str(key), "-out", str(cert),
            "-days", "3650", "-subj", f"/O=appliance/CN={name}",
        ],
        check=True, capture_output=True,
    )
    key.chmod(0o600)
    return cert, key


def manifest(version: str, rootfs_name: str) -> str:
    return (
        f"[update]\ncompatible={COMPATIBLE}\nversion={version}\n\n"
        "[bundle]\nformat=verity\n\n"
        f"[image.rootfs]\nfilename={rootfs_name}\n"
    )


def build_bundle(rootfs: Path, version: str, out: Path, cert: Path, key: Path) -> Path:
    """A bundle holding ``rootfs`` for the ``rootfs`` slot class, signed with ``cert``/``key``."""
    with tempfile.TemporaryDirectory(prefix="bundle-") as scratch:
        content = Path(scratch) / "content"
        content.mkdir()
        # A hard link where the file system allows it: the root image is hundreds of MB.
        try:
            (content / "rootfs.ext4").hardlink_to(rootfs)
        except OSError:
            shutil.copy(rootfs, content / "rootfs.ext4")
        (content / "manifest.raucm").write_text(manifest(version, "rootfs.ext4"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        made = subprocess.run(
            ["rauc", "bundle", f"--cert={cert}", f"--key={key}", f"--keyring={cert}", str(content), str(out)],
            capture_output=True, text=True,
        )
    if made.returncode != 0:
        raise RuntimeError(f"rauc bundle failed: {made.stdout}{made.stderr}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rootfs", type=Path, required=True, help="the root file system image (ext4)")
    parser.add_argument("--version", required=True, help="the version the bundle installs")
    parser.add_argument("--out", type=Path, required=True, help="the bundle (.raucb)")
    parser.add_argument("--keys", type=Path, default=KEY_DIR, help="where the signing key pair is (made if absent)")
    args = parser.parse_args(argv)
    cert, key = dev_keys(args.keys)
    print(build_bundle(args.rootfs, args.version, args.out, cert, key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
