"""``make image-tree`` for real, then: does every path the units and the image's config name exist in it?"""

from __future__ import annotations

import configparser
import fcntl
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from appliance.gateway_config import load_config

ROOT = Path(__file__).resolve().parents[2]
#: Paths a unit may name that the image does not ship: the technician's provisioning file on the boot
#: partition, and the state directory systemd creates (StateDirectory=).
PROVIDED_AT_RUN_TIME = ("/boot/firmware/", "/var/lib/appliance")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("image")
    # `make image-tree` rebuilds build/ in the repository: under pytest-xdist two workers may each run this
    # fixture, so the build holds a lock on a file beside it and they take turns.
    lock_path = ROOT / "build" / ".image-tree.lock"
    lock_path.parent.mkdir(exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # -o: take the venv as up to date; this test checks the image tree, not the dev venv's installation.
        result = subprocess.run(
            ["make", "-o", ".venv/.installed", "image-tree", f"IMAGE_TREE={out / 'tree'}", f"WHEEL_DIR={out / 'wheels'}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=110,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    return out / "tree"


def in_tree(tree: Path, path: str) -> Path:
    return tree / path.lstrip("/")


def units(tree: Path) -> list[tuple[str, configparser.SectionProxy, configparser.SectionProxy]]:
    found = []
    for unit in sorted((tree / "usr/lib/systemd/system").glob("*.service")):
        parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
        parser.optionxform = str  # type: ignore[assignment, method-assign]
        parser.read(unit)
        found.append((unit.name, parser["Unit"], parser["Service"]))
    return found


def test_both_units_are_installed_and_enabled(tree: Path) -> None:
    names = {name for name, _, _ in units(tree)}
    assert names == {"appliance.service", "appliance-firstboot.service"}
    wants = tree / "etc/systemd/system/multi-user.target.wants"
    for name in names:
        link = wants / name
        assert link.is_symlink() and in_tree(tree, os.readlink(link)).is_file()


def test_every_path_a_unit_names_exists_in_the_tree(tree: Path) -> None:
    checked = 0
    for name, unit, service in units(tree):
        binary, *arguments = shlex.split(service["ExecStart"])
        assert os.access(in_tree(tree, binary), os.X_OK), f"{name}: ExecStart {binary} is not an executable in the tree"
        for argument in arguments:
            if argument.startswith("/") and not argument.startswith(PROVIDED_AT_RUN_TIME):
                assert in_tree(tree, argument).exists(), f"{name}: {argument} is missing from the tree"
                checked += 1
        for document in unit.get("Documentation", "").split():
            if document.startswith("file:"):
                assert in_tree(tree, document.removeprefix("file:")).is_file(), f"{name}: {document} missing"
                checked += 1
    assert checked >= 4


def test_the_gateway_unit_runs_the_installed_wheel(tree: Path) -> None:
    venv_python = tree / "opt/appliance/venv/bin/python"
    script = (tree / "opt/appliance/venv/bin/appliance").read_text()
    assert "from appliance.cli import main" in script
    # appliance.hardware.at needs nothing outside the standard library, so it imports without the
    # dependencies the chroot install adds; it proves the venv holds our code.
    result = subprocess.run(
        [str(venv_python), "-I", "-c", "import appliance.hardware.at as m; print(m.__file__)"],
        capture_output=True, text=True, timeout=30, cwd=tree,
    )
    assert result.returncode == 0, result.stderr
    assert str(tree / "opt/appliance/venv") in result.stdout
    [wheel] = (tree / "opt/appliance/wheels").glob("appliance-*.whl")
    assert "appliance/hardware/modem.py" in zipfile.ZipFile(wheel).namelist()


def test_the_image_config_is_valid_and_everything_it_names_is_there(tree: Path) -> None:
    [(_, _, service)] = [unit for unit in units(tree) if unit[0] == "appliance.service"]
    arguments = shlex.split(service["ExecStart"])
    config_path = in_tree(tree, arguments[arguments.index("--config") + 1])
    config = load_config(config_path)
    assert config.data_dir == Path("/var/lib") / service["StateDirectory"]
    assert config.broker.auth.password_file is not None and config.broker.auth.password_file.is_file()
    assert config.broker.auth.password_file.parent == config_path.parent
    assert config.hardware.gpio.enabled and config.hardware.modem.enabled
    assert oct(config_path.stat().st_mode & 0o777) == oct(0o640)


def test_sysusers_creates_the_user_and_groups_the_unit_runs_as(tree: Path) -> None:
    [(_, _, service)] = [unit for unit in units(tree) if unit[0] == "appliance.service"]
    entries = [
        line.split() for line in (tree / "usr/lib/sysusers.d/appliance.conf").read_text().splitlines() if line and not line.startswith("#")
    ]
    users = {fields[1] for fields in entries if fields[0] == "u"}
    groups = {fields[1] for fields in entries if fields[0] == "g"} | users
    assert service["User"] in users
    assert set(service["SupplementaryGroups"].split()) <= groups


def test_firstboot_script_runs_with_the_system_python(tree: Path) -> None:
    script = tree / "usr/local/sbin/appliance-firstboot"
    assert script.read_text().startswith("#!/usr/bin/python3\n") and os.access(script, os.X_OK)
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "boot partition" in result.stdout


def test_the_image_config_keeps_acknowledged_data_through_a_power_cut(tree: Path) -> None:
    """A field gateway loses power: "normal" survives only a killed process, and the QEMU power-cut test lost
    every acknowledged QoS 1 message with it (tests/images/test_qemu_boot.py)."""
    config = load_config(in_tree(tree, "/etc/appliance/gateway.toml"))
    assert config.broker.persistence.synchronous == "full"
    assert config.statestore.sync == "full"


def modem_ports_left_to_the_gateway(tree: Path) -> set[str]:
    """The device names the tree's udev rules give to modem ports they also take away from ModemManager
    (``ENV{ID_MM_PORT_IGNORE}="1"`` with ``SYMLINK+=``)."""
    names = set()
    for rules in sorted((tree / "etc/udev/rules.d").glob("*.rules")):
        for line in rules.read_text().splitlines():
            if 'ENV{ID_MM_PORT_IGNORE}="1"' in line and not line.lstrip().startswith("#"):
                names.update(f"/dev/{name}" for name in re.findall(r'SYMLINK\+="([^"]+)"', line))
    return names


def test_the_modem_port_the_image_config_opens_is_one_modemmanager_leaves_alone(tree: Path) -> None:
    """ModemManager probes and holds every AT port of a modem; the gateway's AT monitor opens its port
    exclusively. A kernel name (``/dev/ttyUSB2``) is whichever USB serial port enumerated third, which
    ModemManager may own: the config must name the port the udev rule excludes, by the name it gives it,
    and the tree that ships the config must ship the rule (the pi-gen stage copies this tree alone)."""
    config = load_config(in_tree(tree, "/etc/appliance/gateway.toml"))
    assert config.hardware.modem.enabled
    assert config.hardware.modem.port in modem_ports_left_to_the_gateway(tree), config.hardware.modem.port
