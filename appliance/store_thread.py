"""One thread per SQLite store, so commits (with fsync) never stall the broker's event loop.

A single worker keeps every store call in submission order, which is what a store's "one thread at a
time" rule and the broker's "calls for one client arrive in publish order" rule both need. The
forwarding queues and the state store each own one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class StoreThread:
    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
