"""``systemd-analyze verify`` on every unit in systemd/, failing on any line it prints.

verify exits 0 on many problems (unknown keys, unparsable values are "ignoring" warnings), so its output
is the verdict, not its exit code. It also checks that ExecStart's binary exists and that the units the
file names can be loaded; both are done against a throwaway root (``--root``) holding a copy of the
distribution's units, our units, and an executable placeholder at each ExecStart path, so the test never
writes outside tmp_path.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "systemd").glob("*.service"))
SYSTEM_UNITS = Path("/usr/lib/systemd/system")


def read_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment, method-assign]
    parser.read(path)
    return parser


def exec_binaries(unit: Path) -> list[str]:
    service = read_unit(unit)["Service"]
    return [service[key].split()[0].lstrip("-@:+!") for key in ("ExecStart", "ExecStartPre", "ExecStop") if key in service]


@pytest.fixture(scope="module")
def analyze() -> str:
    binary = shutil.which("systemd-analyze")
    assert binary, "systemd-analyze is missing: run `make system-deps` (Debian package systemd)"
    return binary


@pytest.fixture(scope="module")
def unit_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("unit-root")
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    target = root / "etc/systemd/system"
    target.mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(unit, target / unit.name)
        for binary in exec_binaries(unit):
            placeholder = root / binary.lstrip("/")
            placeholder.parent.mkdir(parents=True, exist_ok=True)
            placeholder.write_text("#!/bin/sh\n")
            placeholder.chmod(0o755)
    return root


def test_there_are_units_to_check() -> None:
    assert {unit.name for unit in UNITS} >= {"appliance.service", "appliance-firstboot.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_unit_verifies_without_a_single_warning(analyze: str, unit_root: Path, unit: Path) -> None:
    result = subprocess.run(
        [analyze, "verify", f"--root={unit_root}", unit.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=unit_root,
    )
    output = (result.stdout + result.stderr).strip()
    assert output == "" and result.returncode == 0, output


def test_the_check_catches_what_verify_only_warns_about(analyze: str, unit_root: Path) -> None:
    """Guards the test itself: a typo'd key exits 0 but prints, and that print is what fails the unit."""
    broken = unit_root / "etc/systemd/system/broken.service"
    broken.write_text("[Service]\nType=notify\nExecStart=/bin/true\nProtectSystem=stricter\nNoNewPrivilege=yes\n")
    (unit_root / "bin").mkdir(exist_ok=True)
    (unit_root / "bin/true").write_text("#!/bin/sh\n")
    (unit_root / "bin/true").chmod(0o755)
    result = subprocess.run([analyze, "verify", f"--root={unit_root}", "broken.service"], capture_output=True, text=True, timeout=60)
    assert "stricter" in result.stderr and "NoNewPrivilege" in result.stderr
    broken.unlink()


def test_gateway_unit_has_the_operational_settings_the_gateway_relies_on() -> None:
    service = read_unit(ROOT / "systemd/appliance.service")["Service"]
    assert service["Type"] == "notify" and service["Restart"] == "on-failure"
    assert service["WatchdogSec"] and service["StateDirectory"] == "appliance"
    assert service["User"] == "appliance" and service["ProtectSystem"] == "strict"
    assert service["NoNewPrivileges"] == "yes" and service["PrivateTmp"] == "yes"
    assert service["CapabilityBoundingSet"] == ""
    assert "/etc/appliance/" in service["ExecStart"]
    assert "75" in service["RestartForceExitStatus"]  # the factory reset's restart code
