"""``appliance firmware publish`` against a real gateway process, as an operator runs it: the gateway's
config file says where its listener is (not 1883) and which keys the fleet holds; the password comes
from the environment, never argv; a state store ACL lets the operator write one thermostat's key only.

A published version never changes (its signature included), the gateway refuses what the fleet cannot
verify, and a publish that cannot finish changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from appliance.firmware.repository import Repository
from appliance.firmware.signing import load_signing_key, public_key_hex, verifies
from testing.processes import ROOT, free_port, password_file
from tests.broker.clients import FileConfiguredGateway
from tests.firmware.test_firmware_gateway import bundle_file

PASSWORD = "op-secret"


def write_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return key


def tool(config: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m appliance ARGV --config CONFIG``: the password in the environment only."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("APPLIANCE_")}
    env.update(APPLIANCE_USERNAME="operator", APPLIANCE_PASSWORD=PASSWORD)
    return subprocess.run([sys.executable, "-m", "appliance", *argv, "--config", str(config)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@dataclass
class Site:
    work: Path
    config: Path
    gateway: FileConfiguredGateway
    fleet_key: Path
    other_key: Path

    def repository(self) -> Repository:
        return Repository(self.work / "data" / "firmware")

    def bundle(self, version: str, body: bytes = b"app") -> Path:
        return bundle_file(self.work / f"{version}-{len(body)}.zip", {"app.mpy": b"M\x06" + body}, version=version)

    def run(self, *argv: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
        return tool(config or self.config, *argv)

    def lines(self, proc: subprocess.CompletedProcess[str]) -> list[dict]:
        return [json.loads(line) for line in proc.stdout.splitlines()]

    def desired(self, thermostat: str) -> subprocess.CompletedProcess[str]:
        return self.run("state", "get", f"{thermostat}\\desiredFirmware")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    work = tmp_path_factory.mktemp("publish")
    fleet_key, other_key = work / "fleet.pem", work / "other.pem"
    fleet = write_key(fleet_key)
    write_key(other_key)
    passwords = work / "passwd"
    password_file(passwords, {"operator": PASSWORD}, iterations=1000)
    config = work / "gateway.toml"
    config.write_text(f"""\
[gateway]
data_dir = "data"

[[broker.listeners]]
type = "tcp"
host = "0.0.0.0"
port = {free_port()}

[broker.auth]
allow_anonymous = false
password_file = "{passwords}"

[[statestore.acl]]
user = "operator"
prefix = "t-1\\\\"
access = ["read", "write"]

[[statestore.acl]]
user = "operator"
prefix = "t-2\\\\"
access = ["read"]

[firmware]
keys = ["{public_key_hex(fleet)}"]
""")
    with FileConfiguredGateway(work / "data", config=config) as gateway:
        yield Site(work, config, gateway, fleet_key, other_key)


def test_publish_reaches_the_gateway_where_its_config_says_with_the_password_from_the_environment(site: Site) -> None:
    proc = site.run("firmware", "publish", str(site.bundle("1.0.0")), "--key", str(site.fleet_key), "--target", "t-1")
    assert proc.returncode == 0, proc.stderr
    stored, pointed = site.lines(proc)
    assert stored["stored"] == "1.0.0" and stored["signed"] is True and stored["verified"] is True
    assert pointed == {"key": "t-1\\desiredFirmware", "version": "1.0.0", "applied": True}
    assert json.loads(site.desired("t-1").stdout)["value"] == "1.0.0"


def test_the_fleet_keys_refuse_an_unsigned_or_foreign_version_unless_forced(site: Site) -> None:
    unsigned = site.run("firmware", "publish", str(site.bundle("1.1.0")))
    assert unsigned.returncode == 1 and "not signed" in unsigned.stderr and "--force" in unsigned.stderr
    foreign = site.run("firmware", "publish", str(site.bundle("1.1.0")), "--key", str(site.other_key))
    assert foreign.returncode == 1 and "not among the fleet's" in foreign.stderr
    assert "1.1.0" not in site.repository().versions()
    forced = site.run("firmware", "publish", str(site.bundle("1.1.0")), "--key", str(site.other_key), "--force")
    assert forced.returncode == 0, forced.stderr
    assert site.lines(forced)[0]["verified"] is False
    # Pointing thermostats at a stored version the fleet cannot verify is the same refusal.
    again = site.run("firmware", "publish", "--version", "1.1.0", "--target", "t-1")
    assert again.returncode == 1 and "not among the fleet's" in again.stderr


def test_a_published_version_keeps_its_signature(site: Site) -> None:
    bundle = site.bundle("1.2.0")
    first = site.run("firmware", "publish", str(bundle), "--key", str(site.fleet_key))
    assert first.returncode == 0, first.stderr
    signature = site.repository().signature("1.2.0")
    manifest = site.repository().manifest("1.2.0")
    assert signature is not None and manifest is not None
    other = site.run("firmware", "publish", str(bundle), "--key", str(site.other_key), "--force")
    assert other.returncode == 1 and "never changes" in other.stderr and "appliance firmware sign" in other.stderr
    assert site.repository().signature("1.2.0") == signature
    same = site.run("firmware", "publish", str(bundle), "--key", str(site.fleet_key))
    assert same.returncode == 0 and site.lines(same)[0]["new"] is False
    assert site.repository().signature("1.2.0") == signature  # not signed again: the first signature stays
    unkeyed = site.run("firmware", "publish", str(bundle))
    assert unkeyed.returncode == 0 and site.lines(unkeyed)[0]["signed"] is True  # the truth: it is served signed
    # Replacing the signature is a command of its own, checked against the fleet's keys as well.
    refused = site.run("firmware", "sign", "1.2.0", "--key", str(site.other_key))
    assert refused.returncode == 1 and site.repository().signature("1.2.0") == signature
    resigned = site.run("firmware", "sign", "1.2.0", "--key", str(site.other_key), "--force")
    assert resigned.returncode == 0, resigned.stderr
    assert "--force: version 1.2.0 is signed by a key that is not among the fleet's" in resigned.stderr
    replaced = site.repository().signature("1.2.0")
    assert replaced is not None and replaced != signature
    assert verifies(manifest, replaced, load_signing_key(site.other_key).public_key())
    assert not verifies(manifest, replaced, load_signing_key(site.fleet_key).public_key())


def test_an_unsigned_version_is_not_signed_by_a_later_publish(tmp_path: Path) -> None:
    """Without fleet keys a version may be published unsigned; signing it later goes through `sign`."""
    config = tmp_path / "gateway.toml"
    config.write_text('[gateway]\ndata_dir = "data"\n')
    key = tmp_path / "k.pem"
    write_key(key)
    bundle = bundle_file(tmp_path / "b.zip", {"app.mpy": b"M\x06app"}, version="2.0.0")
    first = tool(config, "firmware", "publish", str(bundle))
    assert first.returncode == 0 and json.loads(first.stdout)["verified"] is None
    assert "names no [firmware] keys" in first.stderr  # not accepted without a word
    second = tool(config, "firmware", "publish", str(bundle), "--key", str(key))
    assert second.returncode == 1 and "published unsigned" in second.stderr
    assert Repository(tmp_path / "data" / "firmware").signature("2.0.0") is None


def test_a_publish_that_cannot_point_every_target_changes_nothing(site: Site) -> None:
    """The operator may write t-1's key but not t-2's: t-1 gets its old value back, the version is gone."""
    # t-1 points at 1.0.0 whichever tests ran before (publishing a stored version again with its key changes nothing).
    assert site.run("firmware", "publish", str(site.bundle("1.0.0")), "--key", str(site.fleet_key),
                    "--target", "t-1").returncode == 0
    assert json.loads(site.desired("t-1").stdout)["value"] == "1.0.0"
    proc = site.run("firmware", "publish", str(site.bundle("1.3.0")), "--key", str(site.fleet_key),
                    "--target", "t-1", "--target", "t-2")
    assert proc.returncode == 2 and "not authorized" in proc.stderr
    assert "1.3.0" not in site.repository().versions()
    assert json.loads(site.desired("t-1").stdout)["value"] == "1.0.0"


def test_a_publish_that_cannot_reach_the_state_store_changes_nothing(site: Site, tmp_path: Path) -> None:
    """A config whose gateway is not running (nothing listens on its port)."""
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text(site.config.read_text().replace(f"port = {site.gateway.port}", f"port = {free_port()}"))
    proc = site.run("firmware", "publish", str(site.bundle("1.4.0")), "--key", str(site.fleet_key), "--target", "t-1",
                    config=elsewhere)
    assert proc.returncode == 3 and "cannot set the desired version" in proc.stderr
    assert Repository(tmp_path / "data" / "firmware").versions() == []


def test_public_key_help_names_the_config_fields_that_take_its_output() -> None:
    proc = subprocess.run([sys.executable, "-m", "appliance", "firmware", "public-key", "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    assert "update.key" in text and "[firmware] keys" in text


def test_status_with_a_refused_login_fails_instead_of_reporting_no_thermostats(site: Site) -> None:
    """A wrong password got exit 0 and an empty fleet: the CONNACK's refusal was never read."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("APPLIANCE_")}
    env.update(APPLIANCE_USERNAME="operator", APPLIANCE_PASSWORD="not-the-password")
    proc = subprocess.run([sys.executable, "-m", "appliance", "firmware", "status", "--wait", "0.2",
                           "--config", str(site.config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "Bad user name or password" in proc.stderr
