"""``appliance state`` reaches a gateway the way its config says - a TLS listener that requires a client
certificate, password authentication - with nothing secret on its command line: only ``--config`` and a
credentials file (or the environment). A real gateway process, certificates made with ``cryptography``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.certificates import valid_for
from testing.processes import ROOT, password_file
from tests.broker.clients import FileConfiguredGateway

PASSWORD = "s3cret-op"


@pytest.fixture(scope="module")
def tls_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("tls-tools")
    server_cert, server_key = valid_for(work, "server", 30)
    client_cert, client_key = valid_for(work, "client", 30, common_name="operator")
    passwords = work / "passwd"
    password_file(passwords, {"operator": PASSWORD}, iterations=1000)
    config = work / "gateway.toml"
    config.write_text(f"""\
[gateway]
data_dir = "data"

[[broker.listeners]]
type = "tls"
host = "127.0.0.1"
port = 0
certfile = "{server_cert}"
keyfile = "{server_key}"
cafile = "{client_cert}"
require_certificate = true

[broker.auth]
allow_anonymous = false
password_file = "{passwords}"
""")
    credentials = work / "operator.toml"
    credentials.write_text(f'username = "operator"\npassword = "{PASSWORD}"\ncertfile = "client.pem"\nkeyfile = "client.key"\n')
    credentials.chmod(0o600)
    with FileConfiguredGateway(work / "data", config=config):
        yield work


def state(work: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("APPLIANCE_")}
    environment.update(env)
    return subprocess.run([sys.executable, "-m", "appliance", "state", *argv, "--config", str(work / "gateway.toml"),
                           "--timeout", "5"], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)


def test_state_over_tls_with_a_client_certificate_and_a_password_from_a_credentials_file(tls_site: Path) -> None:
    credentials = str(tls_site / "operator.toml")
    written = state(tls_site, "set", "tools/k", "v1", APPLIANCE_CREDENTIALS=credentials)
    assert written.returncode == 0, written.stderr
    read = state(tls_site, "get", "tools/k", "--credentials", credentials)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["value"] == "v1"


def test_without_the_client_certificate_or_the_password_there_is_no_connection(tls_site: Path) -> None:
    no_certificate = state(tls_site, "get", "tools/k", APPLIANCE_USERNAME="operator", APPLIANCE_PASSWORD=PASSWORD)
    assert no_certificate.returncode == 3 and "cannot connect" in no_certificate.stderr
    wrong_password = state(tls_site, "get", "tools/k", "--credentials", str(tls_site / "operator.toml"),
                           APPLIANCE_PASSWORD="wrong")
    assert wrong_password.returncode == 3
