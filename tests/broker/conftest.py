"""Shared fixtures for the broker's integration tests: one real gateway process per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.processes import GatewayProcess
from tests.broker.versions import LEVELS

FAST_CONFIG = """
[broker.limits]
sys_interval = 1
max_packet_size = 65536
receive_maximum = 20
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway with a 1 s ``$SYS`` interval and a 64 KiB packet limit, shared by one test module."""
    work: Path = tmp_path_factory.mktemp("gateway")
    config = work / "gateway.toml"
    config.write_text(FAST_CONFIG)
    process = GatewayProcess(work / "data", config=config)
    with process:
        yield process
    assert "Traceback" not in process.output(), process.output()


@pytest.fixture(params=LEVELS)
def level(request: pytest.FixtureRequest) -> int:
    """The protocol level a test runs under: each test asking for it runs once per version."""
    return request.param  # type: ignore[no-any-return]
