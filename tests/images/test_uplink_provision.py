"""``appliance-uplink-provision`` (the image's NetworkManager profiles from the boot partition) run for real
on temporary directories: profiles are installed 0600 and removed from the boot side; a file that is not a
keyfile profile stays and fails the run."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "images/gateway/image-rootfs/usr/local/sbin/appliance-uplink-provision"
PROFILE = "[connection]\nid=cellular\ntype=gsm\n\n[gsm]\napn=internet.example\npin=1234\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="installs files owned by root")


def provision(boot: Path, profiles: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "APPLIANCE_BOOT_DIR": str(boot), "APPLIANCE_NM_PROFILES_DIR": str(profiles)}
    return subprocess.run(["sh", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=30)


def test_a_profile_is_installed_root_only_and_removed_from_the_boot_partition(tmp_path: Path) -> None:
    boot, profiles = tmp_path / "boot", tmp_path / "system-connections"
    boot.mkdir()
    (boot / "cellular.nmconnection").write_text(PROFILE)
    (boot / "appliance.toml").write_text("[gateway]\n")  # not this script's: left alone
    result = provision(boot, profiles)
    assert result.returncode == 0, result.stderr
    installed = profiles / "cellular.nmconnection"
    assert installed.read_text() == PROFILE
    assert stat.S_IMODE(installed.stat().st_mode) == 0o600 and installed.stat().st_uid == 0
    assert sorted(path.name for path in boot.iterdir()) == ["appliance.toml"]
    assert sorted(path.name for path in profiles.iterdir()) == ["cellular.nmconnection"]  # no .new left behind


def test_a_file_that_is_not_a_profile_stays_and_fails_the_unit(tmp_path: Path) -> None:
    boot, profiles = tmp_path / "boot", tmp_path / "system-connections"
    boot.mkdir()
    (boot / "apn.nmconnection").write_text("apn=internet.example\n")
    (boot / "wifi.nmconnection").write_text("[connection]\nid=wifi\ntype=wifi\n")
    result = provision(boot, profiles)
    assert result.returncode == 1
    assert "apn.nmconnection has no [connection] section" in result.stderr
    assert sorted(path.name for path in boot.iterdir()) == ["apn.nmconnection"]
    assert sorted(path.name for path in profiles.iterdir()) == ["wifi.nmconnection"]
