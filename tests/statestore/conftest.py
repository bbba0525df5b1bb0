"""Fixtures: one real gateway process per test module, and connected state store clients."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from appliance.statestore.client import StateStoreClient
from testing.processes import GatewayProcess

_ids = itertools.count()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(tmp_path_factory.mktemp("gateway")) as process:
        yield process


@pytest.fixture
def connect(gateway: GatewayProcess) -> Iterator[Callable[..., StateStoreClient]]:
    """Open clients on the module's gateway; all are closed at the end of the test."""
    opened: list[StateStoreClient] = []

    def open_client(client_id: str | None = None, **kwargs: object) -> StateStoreClient:
        client = StateStoreClient(gateway.host, gateway.port, client_id or f"t{next(_ids)}-{id(opened)}", timeout=5, **kwargs)  # type: ignore[arg-type]
        opened.append(client.connect())
        return client

    yield open_client
    for client in opened:
        client.close()


@pytest.fixture
def client(connect: Callable[..., StateStoreClient]) -> StateStoreClient:
    return connect()


@pytest.fixture
def key(request: pytest.FixtureRequest) -> Callable[[str], bytes]:
    """Keys unique to the test, so tests sharing a gateway never see each other's data."""
    return lambda name: f"{request.node.name}/{name}".encode()


