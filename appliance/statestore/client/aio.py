"""``AsyncStateStoreClient``: the asyncio face of a ``StateStoreClient`` (the MQTT I/O stays on paho's
thread; a request's future is awaited through ``asyncio.wrap_future``), and ``NotificationStream``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TypeVar

import appliance.statestore.client.calls as calls
from appliance.statestore.client.blocking import StateStoreClient
from appliance.statestore.client.calls import Call
from appliance.statestore.client.errors import RequestTimeout
from appliance.statestore.client.results import (
    DeleteResult,
    GetResult,
    Notification,
    RawResponse,
    SetResult,
)
from appliance.statestore.commands import Condition
from appliance.statestore.hlc import Hlc

T = TypeVar("T")


class AsyncStateStoreClient:
    """The asyncio face of a ``StateStoreClient`` (the MQTT I/O stays on paho's thread)."""

    def __init__(self, client: StateStoreClient) -> None:
        self.sync = client

    async def __aenter__(self) -> AsyncStateStoreClient:
        await asyncio.to_thread(self.sync.connect)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.sync.close)

    async def request(
        self, payload: bytes, user_properties: Sequence[tuple[str, str]] = (), *, stamp: bool = True, timeout: float | None = None
    ) -> RawResponse:
        future = self.sync.submit(payload, user_properties, stamp=stamp)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a cancellation of the caller.
            async with asyncio.timeout(self.sync.timeout if timeout is None else timeout):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            future.cancel()
            raise RequestTimeout("no response from the state store in time") from None

    async def call(self, call: Call[T], timeout: float | None = None) -> T:
        return call.read(await self.request(call.payload, call.user_properties, timeout=timeout))

    async def set(
        self,
        key: bytes | str,
        value: bytes | str,
        *,
        condition: Condition = Condition.ALWAYS,
        expire_ms: int | None = None,
        fencing_token: Hlc | None = None,
        timeout: float | None = None,
    ) -> SetResult:
        return await self.call(calls.set_(key, value, condition, expire_ms, fencing_token), timeout)

    async def get(self, key: bytes | str, *, timeout: float | None = None) -> GetResult:
        return await self.call(calls.get(key), timeout)

    async def delete(self, key: bytes | str, *, fencing_token: Hlc | None = None, timeout: float | None = None) -> DeleteResult:
        return await self.call(calls.delete(key, fencing_token), timeout)

    async def vdelete(
        self, key: bytes | str, value: bytes | str, *, fencing_token: Hlc | None = None, timeout: float | None = None
    ) -> DeleteResult:
        return await self.call(calls.vdelete(key, value, fencing_token), timeout)

    async def watch(self, key: bytes | str, *, timeout: float | None = None) -> NotificationStream:
        """Register for ``key`` now (so no change after this returns is missed) and return the stream.

        Use it as ``async with await client.watch(k) as notes: async for note in notes: ...``; leaving the
        block sends ``KEYNOTIFY key STOP``.
        """
        stream = NotificationStream(self.sync, calls.as_bytes(key), asyncio.get_running_loop())
        await asyncio.to_thread(self.sync.keynotify, stream.key, stream.deliver, timeout=timeout)
        return stream


class NotificationStream:
    """An async iterator of one key's notifications, fed from the MQTT thread in change order."""

    def __init__(self, client: StateStoreClient, key: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.key, self.loop = client, key, loop
        self.queue: asyncio.Queue[Notification] = asyncio.Queue()

    def deliver(self, note: Notification) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, note)

    def __aiter__(self) -> NotificationStream:
        return self

    async def __anext__(self) -> Notification:
        return await self.queue.get()

    async def close(self) -> None:
        if self.client._connected.is_set():
            await asyncio.to_thread(self.client.stop_keynotify, self.key)

    async def __aenter__(self) -> NotificationStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
