"""Fixtures of the tests that run firmware: micropython processes, mosquitto, MQTT collectors.

The device firmware's tests (here), the OTA tests (``tests/firmware/``) and the image builder's
(``tests/images/``) import them into their conftest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing.collector import Collector
from testing.processes import MosquittoProcess
from tests.device_firmware.micropython import FIRMWARE, MP_TESTS, MicroPython


@pytest.fixture
def micropython(tmp_path: Path) -> Iterator[Any]:
    """Start micropython processes (killed at teardown): micropython(args, cwd=..., path=[...])."""
    started: list[MicroPython] = []

    def start(args, cwd: Path = tmp_path, path=(FIRMWARE, MP_TESTS), heap: str | None = None) -> MicroPython:
        proc = MicroPython([str(a) for a in args], Path(cwd), list(path), heap)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoProcess]:
    with MosquittoProcess(tmp_path / "mosquitto") as broker:
        yield broker


@pytest.fixture
def paho_peer() -> Iterator[Any]:
    """Connect collectors (`testing.collector`: subscribe, next, next_json, publish), closed at teardown."""
    peers: list[Collector] = []

    def connect(host: str, port: int, client_id: str = "") -> Collector:
        peer: Collector = Collector(host, port, client_id=client_id or None, name="paho-peer")
        peers.append(peer)
        return peer

    yield connect
    for peer in peers:
        peer.close()
