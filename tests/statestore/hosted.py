"""The broker and the state store service in the test process, on their own event loop thread.

The gateway-process tests cannot reach inside the service; these can: the service is built here with a
store class that has test hooks (a commit the test holds, a disk that fills up) and a clock the test moves.
Everything else is the real thing - the broker, its listener on a real socket (port 0), SQLite files under
``tmp_path`` and paho-mqtt clients.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from appliance.broker.auth import Authenticator
from appliance.broker.broker import Broker
from appliance.broker.config import BrokerConfig, ListenerConfig
from appliance.broker.persistence import BrokerStore
from appliance.broker.server import start_listener
from appliance.statestore.client import StateStoreClient
from appliance.statestore.config import StateStoreConfig
from appliance.statestore.service import StateStoreService, StoreFactory, wall_clock_ms
from appliance.statestore.store import StateStore

T = TypeVar("T")


class HostedGateway:
    host = "127.0.0.1"

    def __init__(
        self,
        data_dir: Path,
        config: StateStoreConfig = StateStoreConfig(),
        store_factory: StoreFactory = StateStore,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.data_dir = data_dir
        self.service = StateStoreService(config, data_dir, clock_ms=clock_ms, store_factory=store_factory)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._clients: list[StateStoreClient] = []
        self._thread = threading.Thread(target=self.loop.run_forever, name="hosted-gateway", daemon=True)

    @property
    def store(self) -> StateStore:
        assert self.service.store is not None
        return self.service.store

    def client(self, client_id: str) -> StateStoreClient:
        """A connected client, closed before the gateway stops (so its DISCONNECT reaches a live broker)."""
        client = StateStoreClient(self.host, self.port, client_id, timeout=5).connect()
        self._clients.append(client)
        return client

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the gateway's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    def __enter__(self) -> "HostedGateway":
        self._thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        listener = ListenerConfig("tcp", self.host, 0)
        self._broker_store = BrokerStore.open(self.data_dir / "broker.db")
        self.broker = Broker(BrokerConfig((listener,)), self._broker_store, Authenticator(None, True), None, [self.service])
        await self.broker.start()
        self._server, url = await start_listener(self.broker, listener)
        self.port = int(url.rsplit(":", 1)[1])

    async def _stop(self) -> None:
        self._server.close()
        await self.broker.stop()
        await self._server.wait_closed()
        self._broker_store.close()

    def __exit__(self, *exc_info: object) -> None:
        try:
            for client in self._clients:
                client.close()
            self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()
