"""Fixtures of the upstream tests: a real mosquitto as the cloud broker, and the HIL rig's relay in front of
it to throttle, stall and cut the link."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hil_tests.rig.relay import RelayThread
from testing.processes import MosquittoProcess


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoProcess]:
    with MosquittoProcess(tmp_path / "mosquitto") as broker:
        yield broker


@pytest.fixture
def relay(mosquitto: MosquittoProcess) -> Iterator[RelayThread]:
    with RelayThread(mosquitto.host, mosquitto.port) as shaped:
        yield shaped
