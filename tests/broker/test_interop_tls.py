"""A TLS listener next to a TCP one, configured in the file, with a self-signed certificate made by the
openssl command line; paho (v5) and mosquitto_pub connect over TLS and verify the certificate."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.broker.clients import FileConfiguredGateway, PahoClient, unique


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


def test_paho_over_tls_reaches_a_tcp_subscriber(tls_gateway) -> None:
    gateway, tls_port, cert = tls_gateway
    topic = unique("tls")
    plain = PahoClient(gateway.port)
    secure = PahoClient(tls_port)
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


def test_mosquitto_pub_over_tls(tls_gateway) -> None:
    gateway, tls_port, cert = tls_gateway
    topic = unique("tls-cli")
    watcher = PahoClient(gateway.port)
    try:
        watcher.connect()
        watcher.subscribe(topic, 0)
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(tls_port), "--cafile", str(cert), "-t", topic,
                        "-m", "cli over tls"], check=True, timeout=10)
        assert watcher.get().payload == b"cli over tls"
    finally:
        watcher.disconnect()


def test_plain_mqtt_on_the_tls_port_is_refused(tls_gateway) -> None:
    _gateway, tls_port, _cert = tls_gateway
    result = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(tls_port), "-t", "x", "-m", "y"],
                            capture_output=True, timeout=10)
    assert result.returncode != 0
