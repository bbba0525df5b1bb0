"""``appliance-health-check``'s MQTT probe against real brokers: our gateway (``python -m appliance run``)
and mosquitto answer its CONNECT with a CONNACK; a closed port and a peer that never answers do not count.
The rest of the script (systemctl, rauc) runs only on the image: ``tests/images/test_qemu_boot.py``."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import socket
from pathlib import Path
from types import ModuleType

from testing.processes import GatewayProcess, MosquittoProcess, free_port

SCRIPT = Path(__file__).resolve().parents[2] / "images/gateway/image-rootfs/usr/local/sbin/appliance-health-check"


def health_check() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("appliance_health_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_our_gateway_answers_the_probe(tmp_path: Path) -> None:
    with GatewayProcess(tmp_path / "data").start() as gateway:
        assert health_check().broker_answers(gateway.port)


def test_mosquitto_answers_the_probe(tmp_path: Path) -> None:
    with MosquittoProcess(tmp_path).start() as mosquitto:
        assert health_check().broker_answers(mosquitto.port)


def test_a_closed_port_or_a_silent_peer_is_not_an_answer() -> None:
    module = health_check()
    assert not module.broker_answers(free_port(), timeout=1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        assert not module.broker_answers(silent.getsockname()[1], timeout=1)
