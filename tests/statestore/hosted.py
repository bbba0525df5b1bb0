"""The broker and the state store service in the test process, on their own event loop thread.

The gateway-process tests cannot reach inside the service; these can: the service is built here with a
store class that has test hooks (a commit the test holds, a disk that fills up) and a runtime whose clock the test moves.
Everything else is the real thing - the broker, its listener on a real socket (port 0), SQLite files under
``tmp_path`` and paho-mqtt clients.
"""

from __future__ import annotations

from pathlib import Path

from appliance.runtime import Runtime
from appliance.statestore.client import StateStoreClient
from appliance.statestore.config import StateStoreConfig
from appliance.statestore.service import StateStoreService, StoreFactory
from appliance.statestore.store import StateStore
from testing.inprocess import InProcessBroker


class HostedGateway(InProcessBroker):
    """The in-process broker hosting a state store service built with the test's store class and clock."""

    def __init__(
        self,
        data_dir: Path,
        config: StateStoreConfig | None = None,
        store_factory: StoreFactory = StateStore,
        runtime: Runtime | None = None,
    ) -> None:
        self.service = StateStoreService(config or StateStoreConfig(), data_dir, runtime, store_factory)
        super().__init__(data_dir, [self.service])
        self._clients: list[StateStoreClient] = []

    @property
    def store(self) -> StateStore:
        assert self.service.store is not None
        return self.service.store

    def client(self, client_id: str) -> StateStoreClient:
        """A connected client, closed before the gateway stops (so its DISCONNECT reaches a live broker)."""
        client = StateStoreClient(self.host, self.port, client_id, timeout=5).connect()
        self._clients.append(client)
        return client

    def __enter__(self) -> HostedGateway:
        super().__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            for client in self._clients:
                client.close()
        finally:
            super().__exit__(*exc_info)
