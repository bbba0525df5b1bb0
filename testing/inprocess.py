"""The real broker and its listener on an event-loop thread inside the test process.

Process tests (``processes.py``) cannot reach inside the broker; these can: a test hosts its own services,
wraps a broker method to record what happens, or gives the loop a custom implementation (uvloop), while
the broker, the listener on a real socket (port 0) and the SQLite files stay the real ones.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from appliance.broker.api import BrokerService
from appliance.broker.broker import Broker
from appliance.broker.config import BrokerConfig, ListenerConfig
from appliance.broker.persistence.store import BrokerStore
from appliance.broker.security.auth import Authenticator
from appliance.broker.transport.server import start_listener

T = TypeVar("T")


class InProcessBroker:
    """Context manager: ``with InProcessBroker(tmp_path, [service]) as hosted: RawClient(hosted.port)``.

    ``data_dir`` None runs without a store (nothing durable); ``before_listen`` runs on the loop once the
    broker has started and before the listener accepts, for tests that instrument the broker.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        data_dir: Path | None,
        services: Sequence[BrokerService] = (),
        loop: asyncio.AbstractEventLoop | None = None,
        before_listen: Callable[[Broker], None] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.services = list(services)
        self.loop = loop or asyncio.new_event_loop()
        self.before_listen = before_listen
        self.port = 0
        self.broker_store: BrokerStore | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="in-process-broker", daemon=True)

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the broker's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    def __enter__(self) -> InProcessBroker:
        self._thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        listener = ListenerConfig("tcp", self.host, 0)
        if self.data_dir is not None:
            self.broker_store = BrokerStore.open(self.data_dir / "broker.db")
        self.broker = Broker(BrokerConfig((listener,)), self.broker_store, Authenticator(None, True), None, self.services)
        await self.broker.start()
        if self.before_listen is not None:
            self.before_listen(self.broker)
        self._server, url = await start_listener(self.broker, listener)
        self.port = int(url.rsplit(":", 1)[1])

    async def _stop(self) -> None:
        self._server.close()
        await self.broker.stop()
        await self._server.wait_closed()
        if self.broker_store is not None:
            self.broker_store.close()

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()
