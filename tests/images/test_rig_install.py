"""The rig box's install script (images/rig/install.sh), laid out under a throwaway root and checked there.

``--root DIR`` writes only files, so the test sees exactly what a rig box gets: the unit verifies with
``systemd-analyze verify`` against that root, ``systemd-sysusers --root`` makes its user from the shipped
file, the copied rig program runs from its folder alone (it must not reach back into the checkout), the
serial line's udev rule names the device the rig opens, a re-run keeps an operator's settings, and
NetworkManager is told to leave the rig's ports alone.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "images/rig/install.sh"
SYSTEM_UNITS = Path("/usr/lib/systemd/system")


def install(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(INSTALL), "--root", str(root), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def rig_root(tmp_path: Path) -> Path:
    root = tmp_path / "rig-root"
    result = install(root, "--ports", "eth1,eth2")
    assert result.returncode == 0, result.stderr
    return root


def read_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("="))
    parser.optionxform = str  # type: ignore[assignment, method-assign]
    parser.read(path)
    return parser


def test_the_installed_unit_verifies_against_the_rig_root(rig_root: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: run `make system-deps` (Debian package systemd)"
    shutil.copytree(SYSTEM_UNITS, rig_root / "usr/lib/systemd/system", symlinks=True, dirs_exist_ok=True)
    python = rig_root / "usr/bin/python3"  # the rig box's interpreter, a placeholder here
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    result = subprocess.run([analyze, "verify", f"--root={rig_root}", "hil-rig.service"],
                            capture_output=True, text=True, timeout=60, cwd=rig_root)
    assert (result.stdout + result.stderr).strip() == "" and result.returncode == 0, result.stdout + result.stderr
    wants = rig_root / "etc/systemd/system/multi-user.target.wants/hil-rig.service"
    assert wants.is_symlink() and str(wants.readlink()) == "/usr/lib/systemd/system/hil-rig.service"


def test_the_unit_runs_the_bridge_rig_on_the_udev_named_line_with_net_admin_only(rig_root: Path) -> None:
    unit = read_unit(rig_root / "usr/lib/systemd/system/hil-rig.service")
    service = unit["Service"]
    assert "--backend bridge --ports ${RIG_PORTS}" in service["ExecStart"]
    assert "--serial /dev/hilrig" in service["ExecStart"]
    assert service["AmbientCapabilities"] == service["CapabilityBoundingSet"] == "CAP_NET_ADMIN"
    assert service["User"] == "hil-rig" and service["NoNewPrivileges"] == "yes" and "AF_NETLINK" in service["RestrictAddressFamilies"]
    assert service["Restart"] == "always" and service["EnvironmentFile"] == "/etc/hil-rig/rig.env"
    rules = (rig_root / "etc/udev/rules.d/99-hil-rig.rules").read_text()
    active = [line for line in rules.splitlines() if line and not line.startswith("#")]
    assert active == [line for line in active if 'SYMLINK+="hilrig"' in line and "hil-rig.service" not in line]
    assert len(active) == 1 and 'KERNEL=="ttyGS0"' in active[0]
    env = (rig_root / "etc/hil-rig/rig.env").read_text()
    assert "RIG_PORTS=eth1,eth2\n" in env and "RIG_OPTIONS=\n" in env
    modules = (rig_root / "etc/modules-load.d/hil-rig.conf").read_text().split()
    assert {"bridge", "sch_tbf", "nf_tables", "nft_numgen"} <= set(modules)


def test_sysusers_makes_the_rig_user_a_member_of_dialout(rig_root: Path) -> None:
    sysusers = shutil.which("systemd-sysusers")
    assert sysusers
    result = subprocess.run([sysusers, f"--root={rig_root}"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    passwd = (rig_root / "etc/passwd").read_text()
    group = (rig_root / "etc/group").read_text()
    assert any(line.startswith("hil-rig:") and line.endswith(":/usr/sbin/nologin") for line in passwd.splitlines())
    dialout = next(line for line in group.splitlines() if line.startswith("dialout:"))
    assert "hil-rig" in dialout.rsplit(":", 1)[1].split(",")


def test_the_copied_rig_program_runs_from_its_own_folder(rig_root: Path) -> None:
    app = rig_root / "opt/hil-rig"
    probe = "import hil_tests.rig.program as p, hil_tests.rig.bridge; print(p.__file__)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=app, capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(app)
    usage = subprocess.run([sys.executable, "-m", "hil_tests.rig", "--help"], cwd=app, capture_output=True, text=True,
                           timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert usage.returncode == 0 and "--ports" in usage.stdout and "bridge" in usage.stdout
    assert not (app / "appliance").exists() and (app / "hil_tests/rig/PROTOCOL.md").exists()


def test_a_rerun_keeps_edited_settings_and_the_gadget_option_edits_the_boot_config_once(rig_root: Path) -> None:
    env = rig_root / "etc/hil-rig/rig.env"
    env.write_text(env.read_text().replace("RIG_OPTIONS=\n", "RIG_OPTIONS=--queue-s 2\n"))
    boot = rig_root / "boot/firmware/config.txt"
    boot.parent.mkdir(parents=True)
    boot.write_text("[all]\narm_64bit=1\n")
    for _ in range(2):
        result = install(rig_root, "--gadget")
        assert result.returncode == 0, result.stderr
    assert "RIG_OPTIONS=--queue-s 2\n" in env.read_text() and "RIG_PORTS=eth1,eth2\n" in env.read_text()
    assert boot.read_text().count("dtoverlay=dwc2") == 1
    assert (rig_root / "etc/modules-load.d/hil-rig-gadget.conf").read_text().split("\n")[1:3] == ["dwc2", "g_serial"]


def test_the_unit_does_not_wait_for_its_serial_line_and_gives_up_on_a_rig_that_cannot_start(rig_root: Path) -> None:
    """Issue 26 section 7: ``BindsTo=dev-hilrig.device`` held boot up while the USB-serial adapter was absent
    and stopped the rig, resetting the link, on every unplug; the rig now waits for its line itself. Section
    6: a rig that cannot start (a missing port) is retried a bounded number of times."""
    unit = read_unit(rig_root / "usr/lib/systemd/system/hil-rig.service")
    dependencies = " ".join(unit["Unit"].get(key, "") for key in ("BindsTo", "Requires", "After", "Wants", "PartOf"))
    assert ".device" not in dependencies
    assert int(unit["Unit"]["StartLimitBurst"]) > 1 and unit["Unit"]["StartLimitIntervalSec"]
    service = unit["Service"]
    # The record of the rig's changes survives a restart (crash recovery) in its own runtime directory.
    assert service["RuntimeDirectory"] == "hil-rig" and service["RuntimeDirectoryPreserve"] == "yes"


def test_ports_given_again_change_only_the_ports_and_networkmanager_leaves_them_alone(rig_root: Path) -> None:
    """Issue 26 section 7: ``install.sh --ports`` rewrote rig.env and lost RIG_OPTIONS; bookworm's
    NetworkManager ran DHCP on the rig's ports."""
    env = rig_root / "etc/hil-rig/rig.env"
    env.write_text(env.read_text().replace("RIG_OPTIONS=\n", "RIG_OPTIONS=--address 192.168.50.3/24 --target 203.0.113.10:1883\n"))
    result = install(rig_root, "--ports", "enx001122334455,eth0")
    assert result.returncode == 0, result.stderr
    text = env.read_text()
    assert "RIG_PORTS=enx001122334455,eth0\n" in text
    assert "RIG_OPTIONS=--address 192.168.50.3/24 --target 203.0.113.10:1883\n" in text
    nm = configparser.ConfigParser(interpolation=None)
    nm.read(rig_root / "etc/NetworkManager/conf.d/90-hil-rig.conf")
    assert nm["keyfile"]["unmanaged-devices"].split(";") == [
        "interface-name:enx001122334455", "interface-name:eth0", "interface-name:hilbr0"
    ]


@pytest.mark.parametrize("ports", ["eth1", "eth1,eth1", "eth1,", ",eth2", "eth1,eth2,eth3", "eth1, eth2"])
def test_bad_port_lists_are_refused_before_anything_is_written(tmp_path: Path, ports: str) -> None:
    result = install(tmp_path / "root", "--ports", ports)
    assert result.returncode != 0 and "--ports" in result.stderr
    assert not (tmp_path / "root").exists()


def test_unknown_options_are_refused(tmp_path: Path) -> None:
    result = install(tmp_path / "root", "--portz", "eth1,eth2")
    assert result.returncode != 0 and "unknown option: --portz" in result.stderr
