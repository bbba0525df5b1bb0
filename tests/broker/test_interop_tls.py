"""A TLS listener next to a TCP one, configured in the file, with a self-signed certificate made by the
openssl command line; paho and mosquitto_pub (MQTT 3.1.1 and 5) connect over TLS and verify the certificate."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from appliance.broker.codec import packets as pk
from testing.certificates import valid_for
from tests.broker.clients import FileConfiguredGateway, PahoClient, unique

#: mosquitto_pub's ``-V`` for each protocol level.
MOSQUITTO_VERSION = {pk.MQTT_311: "mqttv311", pk.MQTT_5: "mqttv5"}


@pytest.fixture(scope="module")
def tls_gateway(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("tls")
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    config = work / "gateway.toml"
    config.write_text(
        '[[broker.listeners]]\ntype = "tcp"\nhost = "127.0.0.1"\nport = 0\n\n'
        f'[[broker.listeners]]\ntype = "tls"\nhost = "127.0.0.1"\nport = 0\ncertfile = "{cert}"\nkeyfile = "{key}"\n'
    )
    with FileConfiguredGateway(work / "data", config=config) as gateway:
        match = re.search(r"tls://127\.0\.0\.1:(\d+)", gateway.output())
        assert match, gateway.output()
        yield gateway, int(match.group(1)), cert


def test_paho_over_tls_reaches_a_tcp_subscriber(tls_gateway, level: int) -> None:
    gateway, tls_port, cert = tls_gateway
    topic = unique("tls")
    plain = PahoClient(gateway.port, v5=level == pk.MQTT_5)
    secure = PahoClient(tls_port, v5=level == pk.MQTT_5)
    secure.client.tls_set(ca_certs=str(cert))
    try:
        plain.connect()
        plain.subscribe(topic, 1)
        secure.connect()
        secure.publish(topic, b"encrypted on the way in", 1)
        assert plain.get().payload == b"encrypted on the way in"
    finally:
        plain.disconnect()
        secure.disconnect()


def test_mosquitto_pub_over_tls(tls_gateway, level: int) -> None:
    gateway, tls_port, cert = tls_gateway
    topic = unique("tls-cli")
    watcher = PahoClient(gateway.port, v5=level == pk.MQTT_5)
    try:
        watcher.connect()
        watcher.subscribe(topic, 0)
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(tls_port), "--cafile", str(cert), "-t", topic,
                        "-V", MOSQUITTO_VERSION[level], "-m", "cli over tls"], check=True, timeout=10)
        assert watcher.get().payload == b"cli over tls"
    finally:
        watcher.disconnect()


def test_plain_mqtt_on_the_tls_port_is_refused(tls_gateway) -> None:
    """Version-free: the TLS handshake fails before any MQTT is read."""
    _gateway, tls_port, _cert = tls_gateway
    result = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(tls_port), "-t", "x", "-m", "y"],
                            capture_output=True, timeout=10)
    assert result.returncode != 0


def _start_with_tls_files(work: Path, cert: Path, key: Path) -> subprocess.CompletedProcess[str]:
    config = work / "gateway.toml"
    config.write_text(f'[[broker.listeners]]\ntype = "tls"\nhost = "127.0.0.1"\nport = 0\ncertfile = "{cert}"\nkeyfile = "{key}"\n')
    return subprocess.run([sys.executable, "-m", "appliance", "run", "--config", str(config), "--data-dir", str(work / "data")],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("damage", ["missing certfile", "missing keyfile", "certfile not PEM", "key of another certificate"])
def test_a_tls_file_that_cannot_be_used_stops_the_start_naming_the_file(tmp_path: Path, damage: str) -> None:
    """OpenSSL says "[SSL] PEM lib" or "[Errno 2]" and no file; the gateway names the file and the problem.
    Version-free: the gateway stops before any client connects."""
    def pair(stem: str) -> tuple[Path, Path]:
        cert, key = tmp_path / f"{stem}.pem", tmp_path / f"{stem}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                        "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
        return cert, key

    cert, key = pair("server")
    named = {"missing certfile": cert, "missing keyfile": key, "certfile not PEM": cert, "key of another certificate": key}[damage]
    if damage.startswith("missing"):
        named.unlink()
    elif damage == "certfile not PEM":
        cert.write_bytes(b"this is not a certificate\n")
    else:
        key.write_bytes(pair("other")[1].read_bytes())
    result = _start_with_tls_files(tmp_path, cert, key)
    assert result.returncode == 1, result.stdout + result.stderr
    assert str(named) in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(("days_left", "words"), [(-2, "expired on"), (10, "expires on")], ids=["expired", "near-expiry"])
def test_a_certificate_past_or_near_its_expiry_is_warned_about_at_start_naming_file_and_date(
    tmp_path: Path, days_left: int, words: str
) -> None:
    """Decided: a warning, not a refusal (mosquitto loads it too; a Pi booting with a wrong clock must
    not lose its broker): the gateway starts, and its log says which file, which certificate, which date."""
    cert, key = valid_for(tmp_path, "server", days_left)
    config = tmp_path / "gateway.toml"
    config.write_text('[[broker.listeners]]\ntype = "tcp"\nhost = "127.0.0.1"\nport = 0\n\n'
                      f'[[broker.listeners]]\ntype = "tls"\nhost = "127.0.0.1"\nport = 0\ncertfile = "{cert}"\nkeyfile = "{key}"\n')
    with FileConfiguredGateway(tmp_path / "data", config=config) as gateway:
        date = (datetime.now(UTC) + timedelta(days=days_left)).strftime("%Y-%m-%d")
        line = gateway.wait_for_log(rf"WARNING .*TLS certfile {re.escape(str(cert))}: certificate CN=localhost {words} {date}")
        assert line is not None
        assert "Traceback" not in gateway.output()
    [fine_cert, fine_key] = valid_for(tmp_path, "fine", 300)
    config.write_text('[[broker.listeners]]\ntype = "tcp"\nhost = "127.0.0.1"\nport = 0\n\n'
                      f'[[broker.listeners]]\ntype = "tls"\nhost = "127.0.0.1"\nport = 0\n'
                      f'certfile = "{fine_cert}"\nkeyfile = "{fine_key}"\n')
    with FileConfiguredGateway(tmp_path / "data", config=config) as gateway:
        assert "WARNING" not in gateway.output()
