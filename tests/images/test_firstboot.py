"""First-boot provisioning (images/gateway/rootfs/usr/local/sbin/appliance-firstboot) run as a process,
validating with the real ``appliance check-config``, on copies of the image's config in tmp_path."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.gateway_config import load_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images/gateway/rootfs/usr/local/sbin/appliance-firstboot"
IMAGE_CONFIG = ROOT / "images/gateway/rootfs/etc/appliance"
APPLIANCE = Path(sys.executable).parent / "appliance"

PROVISION = """\
[gateway]
id = "site-042"

[upstream]
host = "hub.example.com"
port = 8883
tls = true
username = "site-042"
password = "s3cr\\"et"
"""


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    boot, etc = tmp_path / "boot", tmp_path / "etc"
    boot.mkdir()
    shutil.copytree(IMAGE_CONFIG, etc)
    return boot, etc


def firstboot(boot: Path, etc: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--group", "root", "--check", str(APPLIANCE), str(boot / "appliance.toml"), str(etc)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_provisions_id_and_upstream_credentials_then_wipes_the_boot_files(dirs: tuple[Path, Path]) -> None:
    boot, etc = dirs
    (boot / "appliance.toml").write_text(PROVISION)
    (boot / "appliance-passwd").write_text("thermostat-1:$7$101$c2FsdA==$ZGlnZXN0\n")
    original = (etc / "gateway.toml").read_text()

    result = firstboot(boot, etc)

    assert result.returncode == 0, result.stderr
    assert "provisioned gateway site-042" in result.stdout
    config = load_config(etc / "gateway.toml")
    assert config.gateway_id == "site-042"
    assert config.forwarding.upstream.host == "hub.example.com" and config.forwarding.upstream.tls
    assert config.forwarding.upstream.password == 's3cr"et'
    assert config.hardware.modem.enabled  # the rest of the image config is untouched
    assert "# Configuration of the gateway image" in (etc / "gateway.toml").read_text()
    assert len((etc / "gateway.toml").read_text().splitlines()) > len(original.splitlines())
    assert (etc / "passwd").read_text().startswith("thermostat-1:")
    assert oct((etc / "gateway.toml").stat().st_mode & 0o777) == oct(0o640)
    assert list(boot.iterdir()) == []  # no credentials left on the boot partition
    assert not list(etc.glob("*.new"))

    (boot / "appliance.toml").write_text(PROVISION.replace("site-042", "site-043"))
    assert firstboot(boot, etc).returncode == 0  # re-provisioning replaces, never duplicates
    again = load_config(etc / "gateway.toml")
    assert again.gateway_id == "site-043"
    assert (etc / "gateway.toml").read_text().count("[forwarding.upstream]") == 1


@pytest.mark.parametrize(
    ("provision", "error"),
    [
        ('[gateway]\nid = "bad id!"\n', "gateway.id must be"),
        ("[gateway]\n", "gateway.id must be"),
        ("not toml [", "cannot read"),
        ('[gateway]\nid = "a"\n[wifi]\nssid = "x"\n', "unknown table(s): wifi"),
        ('[gateway]\nid = "a"\n[upstream]\nhots = "typo"\n', "forwarding.upstream.hots"),  # check-config says no
    ],
)
def test_a_bad_provisioning_file_changes_nothing(dirs: tuple[Path, Path], provision: str, error: str) -> None:
    boot, etc = dirs
    (boot / "appliance.toml").write_text(provision)
    (boot / "appliance-passwd").write_text("user:hash\n")
    before = {path.name: path.read_bytes() for path in etc.iterdir()}

    result = firstboot(boot, etc)

    assert result.returncode == 1
    assert error in result.stderr
    assert {path.name: path.read_bytes() for path in etc.iterdir()} == before
    assert (boot / "appliance.toml").read_text() == provision  # kept, so it can be fixed and retried
