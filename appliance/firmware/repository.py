"""Firmware bundles on the gateway: read and verify a build's zip, sign its device manifest, keep versions.

A bundle (``images/firmware/build.py``) is a zip of ``.mpy`` modules with ``manifest.json`` (name, version,
bytecode version, every file's size and sha256). What a thermostat fetches is ``manifest.txt``, the same
facts in lines a 64 KB device reads one at a time without a JSON parser's allocations::

    thermostat-fw 0.2.0 6
    app.mpy 526 3f1a...(sha256 hex)

and, when published with ``--key``, ``manifest.sig``: the ECDSA P-256 signature of ``manifest.txt`` (its
sha256), as the 64 bytes r||s the device's ``p256.py`` takes (``signing.py``). Only the modules travel;
the config template stays on the gateway.

Each version is a directory ``<data_dir>/firmware/<version>/`` holding exactly the files a thermostat may
ask for; it is written beside the others and renamed into place, and never changed afterwards (devices may
hold half of it): publishing a version again with other bytes is refused, and so is another signature -
or one where there was none, or none where there was one - since a thermostat holding the first key
refuses what a second one signed. The signature is part of what a version is; replacing it is a separate,
deliberate act (``replace_signature``, ``appliance firmware sign``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from appliance import atomic_file
from appliance.firmware.protocol import MANIFEST, NAME, SIGNATURE

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
    import zipfile  # here, not with the module: every gateway start with the state store imports it, only a publish reads a zip

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


class Repository:
    """The versions under ``<data_dir>/firmware``; file reads go through a small in-memory cache."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        #: Keyed by the version directory's inode too: a version a failed publish stored and took back
        #: may be published again with other bytes, and must not be served from the first one's files.
        self._cache: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()

    def versions(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME.fullmatch(p.name))

    def store(self, bundle: Bundle, signature: bytes | None) -> bool:
        """Write a version (atomically: a directory renamed into place); True if it was new. The same
        files and signature again is a no-op; anything else under a stored version is refused."""
        files = dict(bundle.modules)
        files[MANIFEST] = device_manifest(bundle)
        files["manifest.json"] = bundle.manifest_json
        target = self.root / bundle.version
        if target.exists():
            stored = {p.name: p.read_bytes() for p in target.iterdir() if p.name != SIGNATURE}
            if stored != files:
                raise BundleError(f"version {bundle.version} is already published with other contents;"
                                  " a version never changes (thermostats may hold part of it): build a new version")
            if signature != self.signature(bundle.version):
                raise BundleError(f"version {bundle.version} is already published with another signature (or"
                                  " none); a version never changes: build a new version, or replace its signature"
                                  " deliberately with `appliance firmware sign`")
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".{bundle.version}.{os.getpid()}.new"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        if signature is not None:
            files[SIGNATURE] = signature
        for name, data in files.items():
            (staging / name).write_bytes(data)
        try:
            os.rename(staging, target)
        except OSError:  # another publish of this version renamed its copy first: judged as a stored one
            shutil.rmtree(staging, ignore_errors=True)
            if not target.exists():
                raise
            return self.store(bundle, signature)
        return True

    def path(self, version: str) -> Path:
        return self.root / version

    def signature(self, version: str) -> bytes | None:
        """The stored ``manifest.sig`` of a version (read from disk: ``replace_signature`` may change it)."""
        try:
            return (self.root / version / SIGNATURE).read_bytes()
        except OSError:
            return None

    def replace_signature(self, version: str, signature: bytes) -> None:
        """Give a stored version a new signature, atomically (``appliance firmware sign``: deliberate)."""
        atomic_file.write_bytes(self.root / version / SIGNATURE, signature)

    def remove(self, version: str) -> None:
        """Take back a version a failed publish stored (no thermostat was pointed at it)."""
        target = self.root / version
        doomed = self.root / f".{version}.{os.getpid()}.gone"
        os.rename(target, doomed)  # one step: a reader sees the version whole or not at all
        shutil.rmtree(doomed)

    def manifest(self, version: str) -> bytes | None:
        return self.read(version, MANIFEST)

    def read(self, version: str, name: str) -> bytes | None:
        """A stored file's bytes, None if there is no such version or file (names are checked first)."""
        if not NAME.fullmatch(version) or not NAME.fullmatch(name):
            return None
        try:
            key = (version, name, (self.root / version).stat().st_ino)
        except OSError:
            return None
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        try:
            data = (self.root / version / name).read_bytes()
        except OSError:
            return None  # not cached: the version may be published while the gateway runs
        if name != SIGNATURE:  # the one file that may be replaced (``appliance firmware sign``)
            self._cache[key] = data
            if len(self._cache) > CACHED_FILES:
                self._cache.popitem(last=False)
        return data
