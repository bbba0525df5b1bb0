"""Where a command-line tool connects and with what credentials, resolved from the gateway's config, the
running gateway's ``gateway.json``, the environment and a credentials file - never needing argv for a
secret. (Over real sockets: ``tests/statestore/test_cli_credentials.py``, ``tests/firmware/test_publish.py``.)"""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance import run_state
from appliance.cli import build_parser
from appliance.tool_connection import ConnectionSettings, ConnectionSettingsError, connection_from_args
from testing.campaigns import campaign
from testing.certificates import valid_for


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("APPLIANCE_CREDENTIALS", "APPLIANCE_USERNAME", "APPLIANCE_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


def resolve(*argv: str) -> ConnectionSettings:
    return connection_from_args(build_parser().parse_args(["state", "get", "k", *argv]))


def config_file(tmp_path: Path, listeners: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(f'[gateway]\ndata_dir = "data"\n\n{listeners}')
    return path


TCP = '[[broker.listeners]]\ntype = "tcp"\nhost = "0.0.0.0"\nport = 18830\n'


def test_the_listener_of_the_config_and_a_wildcard_bind_on_loopback(tmp_path: Path) -> None:
    config = config_file(tmp_path, '[[broker.listeners]]\ntype = "websocket"\nport = 9001\n' + TCP)
    connection = resolve("--config", str(config))
    assert (connection.host, connection.port, connection.tls, connection.username) == ("127.0.0.1", 18830, None, None)
    assert resolve("--config", str(config), "--port", "1999").port == 1999


def test_the_port_the_running_gateway_bound(tmp_path: Path) -> None:
    config = config_file(tmp_path, TCP.replace("18830", "0"))
    with pytest.raises(ConnectionSettingsError, match="port is 0"):
        resolve("--config", str(config))
    (tmp_path / "data").mkdir()
    run_state.write(tmp_path / "data", None, ["tcp://0.0.0.0:40123"])  # this process stands in for the gateway
    assert resolve("--config", str(config)).port == 40123


def test_credentials_from_the_environment_and_a_warning_for_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = config_file(tmp_path, TCP)
    monkeypatch.setenv("APPLIANCE_USERNAME", "op")
    monkeypatch.setenv("APPLIANCE_PASSWORD", "from-env")
    connection = resolve("--config", str(config))
    assert (connection.username, connection.password) == ("op", "from-env")
    assert capsys.readouterr().err == ""
    assert resolve("--config", str(config), "--password", "typed").password == "typed"
    assert "visible to every user" in capsys.readouterr().err


def test_a_credentials_file_others_cannot_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_file(tmp_path, TCP)
    credentials = tmp_path / "creds.toml"
    credentials.write_text('username = "op"\npassword = "from-file"\n')
    credentials.chmod(0o644)
    with pytest.raises(ConnectionSettingsError, match="others may read it"):
        resolve("--config", str(config), "--credentials", str(credentials))
    credentials.chmod(0o600)
    assert resolve("--config", str(config), "--credentials", str(credentials)).password == "from-file"
    monkeypatch.setenv("APPLIANCE_CREDENTIALS", str(credentials))
    assert resolve("--config", str(config)).username == "op"
    monkeypatch.setenv("APPLIANCE_PASSWORD", "env-wins")
    assert resolve("--config", str(config)).password == "env-wins"
    credentials.write_text('user = "op"\n')
    with pytest.raises(ConnectionSettingsError, match="unknown field 'user'"):
        resolve("--config", str(config))
    credentials.write_text('password = 5\n')
    with pytest.raises(ConnectionSettingsError, match="must be a string"):
        resolve("--config", str(config))
    for garbage, why in ((b"password = \"unterminated\n", "not valid TOML"), (b"\xff\xfe = 1\n", "not UTF-8")):
        credentials.write_bytes(garbage)
        with pytest.raises(ConnectionSettingsError, match=why):
            resolve("--config", str(config))
    with pytest.raises(ConnectionSettingsError, match="No such file"):
        resolve("--config", str(config), "--credentials", str(tmp_path / "missing.toml"))


def test_a_tls_listener_is_spoken_to_with_tls_and_a_client_certificate(tmp_path: Path) -> None:
    server_cert, server_key = valid_for(tmp_path, "server", 30)
    client_cert, client_key = valid_for(tmp_path, "client", 30, common_name="operator")
    config = config_file(tmp_path, f'[[broker.listeners]]\ntype = "tls"\nport = 8884\ncertfile = "{server_cert}"\n'
                                   f'keyfile = "{server_key}"\ncafile = "{client_cert}"\nrequire_certificate = true\n')
    credentials = tmp_path / "creds.toml"
    credentials.write_text('certfile = "client.pem"\nkeyfile = "client.key"\n')  # relative to the file
    credentials.chmod(0o600)
    connection = resolve("--config", str(config), "--credentials", str(credentials))
    assert connection.port == 8884 and isinstance(connection.tls, ssl.SSLContext)
    assert connection.tls.verify_mode == ssl.CERT_REQUIRED and connection.tls.check_hostname
    trusted = {cert["subject"] for cert in connection.tls.get_ca_certs()}
    assert ((("commonName", "localhost"),),) in trusted  # the gateway's self-signed certificate
    credentials.write_text('certfile = "missing.pem"\n')
    with pytest.raises(ConnectionSettingsError, match="client certificate"):
        resolve("--config", str(config), "--credentials", str(credentials))


def test_a_config_without_a_tcp_or_tls_listener(tmp_path: Path) -> None:
    config = config_file(tmp_path, '[[broker.listeners]]\ntype = "websocket"\nport = 9001\n')
    with pytest.raises(ConnectionSettingsError, match="no tcp or tls listener"):
        resolve("--config", str(config))


@given(content=st.one_of(st.binary(max_size=200),
                         st.dictionaries(st.sampled_from(["username", "password", "certfile", "cafile", "x"]),
                                         st.one_of(st.text(max_size=20), st.integers(), st.booleans()), max_size=4)
                         .map(lambda d: "".join(f"{k} = {json.dumps(v)}\n" for k, v in d.items()).encode())))
@campaign(100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_credentials_file_gives_a_connection_or_a_clear_error(tmp_path: Path, content: bytes) -> None:
    config = config_file(tmp_path, TCP)
    credentials = tmp_path / "creds.toml"
    credentials.write_bytes(content)
    credentials.chmod(0o600)
    try:
        connection = resolve("--config", str(config), "--credentials", str(credentials))
    except ConnectionSettingsError as exc:
        assert str(exc).startswith(f"credentials file {credentials}") or "client certificate" in str(exc)
    else:
        assert connection.port == 18830
