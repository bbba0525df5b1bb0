"""MQTT over WebSocket: paho's websockets transport (3.1.1 and 5) against a websocket listener, talking
to a subscriber on the plain TCP listener of the same gateway."""

from __future__ import annotations

import re
import socket

import pytest

from appliance.broker.codec import packets as pk
from tests.broker.clients import FileConfiguredGateway, PahoClient, unique


@pytest.fixture(scope="module")
def ws_gateway(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("ws")
    config = work / "gateway.toml"
    config.write_text(
        '[[broker.listeners]]\ntype = "tcp"\nhost = "127.0.0.1"\nport = 0\n\n'
        '[[broker.listeners]]\ntype = "websocket"\nhost = "127.0.0.1"\nport = 0\n'
    )
    with FileConfiguredGateway(work / "data", config=config) as gateway:
        match = re.search(r"ws://127\.0\.0\.1:(\d+)", gateway.output())
        assert match, gateway.output()
        yield gateway, int(match.group(1))


def test_paho_over_websocket_both_directions(ws_gateway, level: int) -> None:
    gateway, ws_port = ws_gateway
    v5 = level == pk.MQTT_5
    topic = unique("ws")
    plain = PahoClient(gateway.port, v5=v5)
    browser = PahoClient(ws_port, v5=v5, transport="websockets")
    browser.client.ws_set_options(path="/mqtt")
    try:
        plain.connect()
        plain.subscribe(f"{topic}/up", 1)
        _flags, reason, _props = browser.connect()
        assert not reason.is_failure
        browser.subscribe(f"{topic}/down", 1)
        browser.publish(f"{topic}/up", b"x" * 70000, 1)  # larger than one small frame
        assert plain.get().payload == b"x" * 70000
        plain.publish(f"{topic}/down", b"to the browser", 1)
        assert browser.get().payload == b"to the browser"
    finally:
        plain.disconnect()
        browser.disconnect()


def test_plain_mqtt_on_the_websocket_port_is_refused(ws_gateway) -> None:
    """Version-free: the HTTP upgrade is refused before any MQTT is read."""
    _gateway, ws_port = ws_gateway
    with socket.create_connection(("127.0.0.1", ws_port), timeout=5) as sock:
        sock.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00" + b"\r\n\r\n")
        answer = b""
        while chunk := sock.recv(100):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 ")  # an HTTP refusal, then the connection closes
