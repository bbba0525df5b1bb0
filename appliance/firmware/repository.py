"""Firmware bundles on the gateway: read and verify a build's zip, sign its device manifest, keep versions.

A bundle (``images/firmware/build.py``) is a zip of ``.mpy`` modules with ``manifest.json`` (name, version,
bytecode version, every file's size and sha256). What a thermostat fetches is ``manifest.txt``, the same
facts in lines a 64 KB device reads one at a time without a JSON parser's allocations::

    thermostat-fw 0.2.0 6
    app.mpy 526 3f1a...(sha256 hex)

and, when published with ``--key``, ``manifest.sig``: the ECDSA P-256 signature of ``manifest.txt`` (its
sha256), as the 64 bytes r||s the device's ``p256.py`` takes. Only the modules travel; the config template
stays on the gateway.

Each version is a directory ``<data_dir>/firmware/<version>/`` holding exactly the files a thermostat may
ask for; it is written beside the others and renamed into place, and never changed afterwards (devices may
hold half of it): publishing a version again with other bytes is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.firmware.protocol import MANIFEST, NAME, SIGNATURE

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

#: Files of recently served versions kept in memory, so a fleet update reads each file from disk once.
CACHED_FILES = 64


class BundleError(Exception):
    """A bundle that cannot be published (the message says why)."""


@dataclass(frozen=True)
class Bundle:
    name: str
    version: str
    mpy_version: int
    modules: dict[str, bytes]
    manifest_json: bytes


def read_bundle(path: Path) -> Bundle:
    """The bundle's modules, every one checked against the manifest's size and sha256."""
    try:
        with zipfile.ZipFile(path) as archive:
            manifest_json = archive.read("manifest.json")
            manifest = json.loads(manifest_json)
            version = manifest["version"]
            mpy_version = manifest["mpy_version"]
            modules = {}
            for entry in manifest["files"]:
                name = entry["path"]
                data = archive.read(name)
                if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise BundleError(f"{path}: {name} does not match the manifest's size and sha256")
                if name.endswith(".mpy"):
                    modules[name] = data
    except BundleError:
        raise
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as exc:
        raise BundleError(f"{path}: not a firmware bundle ({exc})") from exc
    if not isinstance(version, str) or not NAME.fullmatch(version):
        raise BundleError(f"{path}: version {version!r} is not 1-32 of A-Za-z0-9._- (it names a directory on the device)")
    if not isinstance(mpy_version, int) or isinstance(mpy_version, bool):
        raise BundleError(f"{path}: mpy_version {mpy_version!r} is not a number")
    for name in modules:
        if not NAME.fullmatch(name):
            raise BundleError(f"{path}: file name {name!r} is not 1-32 of A-Za-z0-9._-")
    if not modules:
        raise BundleError(f"{path}: no .mpy modules")
    return Bundle(str(manifest.get("name", "firmware")), version, mpy_version, modules, manifest_json)


def device_manifest(bundle: Bundle) -> bytes:
    lines = [f"{bundle.name} {bundle.version} {bundle.mpy_version}"]
    lines += [f"{name} {len(data)} {hashlib.sha256(data).hexdigest()}" for name, data in sorted(bundle.modules.items())]
    return ("\n".join(lines) + "\n").encode("ascii")


def load_signing_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """An EC P-256 private key from a PEM file (e.g. ``openssl ecparam -name prime256v1 -genkey -noout``).

    ``cryptography`` is imported by the signing functions only: they run in ``appliance firmware``, never in
    the gateway, whose firmware service imports this module and would otherwise carry the library's 11 MB
    of resident memory (bench/RESULTS.md, idle connections)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise BundleError(f"{path}: not a PEM private key without a password ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise BundleError(f"{path}: not an ECDSA P-256 (prime256v1) key")
    return key


def sign(data: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    """ECDSA P-256 over sha256(data), as r||s (32 bytes each, big-endian)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def public_key_hex(key: ec.EllipticCurvePrivateKey) -> str:
    """The device config's ``ota.key``: X||Y of the public key, hex."""
    numbers = key.public_key().public_numbers()
    return (numbers.x.to_bytes(32, "big") + numbers.y.to_bytes(32, "big")).hex()


class Repository:
    """The versions under ``<data_dir>/firmware``; file reads go through a small in-memory cache."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._cache: OrderedDict[tuple[str, str], bytes] = OrderedDict()

    def versions(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME.fullmatch(p.name))

    def store(self, bundle: Bundle, signature: bytes | None) -> Path:
        """Write a version (atomically: a directory renamed into place). The same bytes again is a no-op;
        other bytes under a stored version are refused."""
        files = dict(bundle.modules)
        files[MANIFEST] = device_manifest(bundle)
        files["manifest.json"] = bundle.manifest_json
        target = self.root / bundle.version
        if target.exists():
            stored = {p.name: p.read_bytes() for p in target.iterdir() if p.name != SIGNATURE}
            if stored != files:
                raise BundleError(f"version {bundle.version} is already published with other contents;"
                                  " a version never changes (thermostats may hold part of it): build a new version")
            if signature is not None:
                self._write_atomically(target / SIGNATURE, signature)
            return target
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".{bundle.version}.{os.getpid()}.new"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        if signature is not None:
            files[SIGNATURE] = signature
        for name, data in files.items():
            (staging / name).write_bytes(data)
        os.rename(staging, target)
        return target

    @staticmethod
    def _write_atomically(path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def manifest(self, version: str) -> bytes | None:
        return self.read(version, MANIFEST)

    def read(self, version: str, name: str) -> bytes | None:
        """A stored file's bytes, None if there is no such version or file (names are checked first)."""
        if not NAME.fullmatch(version) or not NAME.fullmatch(name):
            return None
        key = (version, name)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        try:
            data = (self.root / version / name).read_bytes()
        except OSError:
            return None  # not cached: the version may be published while the gateway runs
        if name != SIGNATURE:  # the one file a later publish may replace (signing a stored version)
            self._cache[key] = data
            if len(self._cache) > CACHED_FILES:
                self._cache.popitem(last=False)
        return data
