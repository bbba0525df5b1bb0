"""Deploy a firmware bundle to a board on a serial port with mpremote.

Checks the bundle first (every file against the manifest's sha256, the per-device config has a
`thermostat` name), then copies the .mpy modules and the config, sets the board's RTC from this
machine (state store timestamps must be within a minute of the gateway), writes `main.py` and
resets the board. Boards autostart only `main.py`, never `main.mpy`, hence a two-line source stub
that imports `thermostat` (a .py is found before a .mpy, so the stub must not be imported itself).

Usage: python images/firmware/deploy.py BUNDLE.zip --port /dev/ttyUSB0 --config device.json [--dry-run]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

BOOT_STUB = "import app  # noqa: F401\n"


class DeployError(Exception):
    pass


def read_bundle(bundle: Path, into: Path) -> dict:
    """Extract and verify; returns the manifest."""
    try:
        with zipfile.ZipFile(bundle) as archive:
            manifest = json.loads(archive.read("manifest.json"))
            for entry in manifest["files"]:
                data = archive.read(entry["path"])
                if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise DeployError(f"{entry['path']}: sha256 does not match the manifest")
                (into / entry["path"]).write_bytes(data)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise DeployError(f"{bundle}: not a valid firmware bundle ({exc})") from exc
    return manifest


def check_config(path: Path) -> None:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DeployError(f"{path}: unreadable config ({exc})") from exc
    name = config.get("thermostat")
    if not isinstance(name, str) or not name or name.startswith("<"):
        raise DeployError(f"{path}: set 'thermostat' to this device's name (see the bundle's config template)")


def mpremote_commands(manifest: dict, staged: Path, config: Path, port: str) -> list[list[str]]:
    connect = ["mpremote", "connect", port]
    modules = [e["path"] for e in manifest["files"] if e["path"].endswith(".mpy") and e["path"] != "main.mpy"]
    commands = [connect + ["fs", "cp", str(staged / name), f":{name}"] for name in modules]
    commands.append(connect + ["fs", "cp", str(config), ":config.json"])
    commands.append(connect + ["fs", "cp", str(staged / "main.py"), ":main.py"])
    commands.append(connect + ["rtc", "--set"])
    commands.append(connect + ["reset"])
    return commands


def deploy(bundle: Path, port: str, config: Path, dry_run: bool) -> None:
    check_config(config)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        manifest = read_bundle(bundle, staged)
        (staged / "main.py").write_text(BOOT_STUB)
        commands = mpremote_commands(manifest, staged, config, port)
        print(f"# {manifest['name']} {manifest['version']} (mpy v{manifest['mpy_version']}) -> {port}")
        for command in commands:
            print(shlex.join(command))
            if not dry_run:
                command[0] = shutil.which("mpremote") or str(Path(sys.executable).with_name("mpremote"))
                if subprocess.run(command).returncode != 0:
                    raise DeployError(f"failed: {shlex.join(command)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--port", required=True, help="serial port of the board, e.g. /dev/ttyUSB0")
    parser.add_argument("--config", type=Path, required=True, help="this device's config (from the template)")
    parser.add_argument("--dry-run", action="store_true", help="verify and print the mpremote commands only")
    args = parser.parse_args(argv)
    try:
        deploy(args.bundle, args.port, args.config, args.dry_run)
    except DeployError as exc:
        print(f"deploy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
