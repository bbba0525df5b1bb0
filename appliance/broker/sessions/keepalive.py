"""Every connection's keep-alive deadline in one heap, checked by one timer of the runtime.

MQTT's keep-alive (MQTT 5 3.1.2.10, 3.1.1 3.1.2.10): a server closes a connection that sent nothing for one
and a half times the keep-alive the client asked for. A timer per connection did this exactly, but on
uvloop a waiting timer (its handle, its libuv timer, its arguments) costs about 600 bytes, and idle
connections are what a gateway holds most of (bench/idle_connections.py). One heap entry costs about a
third of that.

Rules:

* a connection is checked at its deadline, ``last_received + seconds``, never before: if a packet came
  meanwhile its entry moves to the new deadline, otherwise ``expired`` is called with its link. Reads do
  not touch the heap (they only update ``last_received``), as aiohttp re-arms its keep-alive timer only
  when it fires;
* one runtime timer, armed for the earliest deadline; it moves only when an earlier one arrives;
* a connection that goes (``forget``) leaves nothing that keeps it alive: its entry is emptied at once,
  and the heap is rebuilt once emptied entries are more than half of it (asyncio's rule for its
  cancelled timers), so clients that connect and leave in a loop cannot grow it.

No asyncio and no clock of its own: time comes from the runtime port, so the tests run it on a fake clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

from appliance.broker.sessions.session import ClientConnection
from appliance.broker.transport.link import Link
from appliance.runtime import Runtime, Timer

#: Emptied entries the heap may hold before a rebuild is considered (a rebuild of a tiny heap is pointless).
REBUILD_FLOOR = 64


class KeepAlive:
    """The keep-alive deadlines of a broker's connections (see the module docstring)."""

    __slots__ = ("_runtime", "_expired", "_heap", "_entries", "_order", "_timer", "_timer_at", "_emptied")

    def __init__(self, runtime: Runtime, expired: Callable[[Link], None]) -> None:
        self._runtime = runtime
        self._expired = expired
        #: Entries ``[deadline, order, link or None once forgotten, seconds]``, a heap by deadline.
        self._heap: list[list[Any]] = []
        self._entries: dict[ClientConnection, list[Any]] = {}
        self._order = itertools.count()
        self._timer: Timer | None = None
        self._timer_at = math.inf
        self._emptied = 0

    def __len__(self) -> int:
        """Connections watched."""
        return len(self._entries)

    def watch(self, link: Link, seconds: float, now: float) -> None:
        """Close ``link`` once it has sent nothing for ``seconds``, counted from its last packet; ``now``:
        the monotonic reading of the batch that asks (the timer's delay is counted from it)."""
        connection = link.connection
        self.forget(connection)
        entry = [connection.last_received + seconds, next(self._order), link, seconds]
        self._entries[connection] = entry
        heapq.heappush(self._heap, entry)
        self._arm(now)

    def forget(self, connection: ClientConnection) -> None:
        """The connection is gone: stop watching it."""
        entry = self._entries.pop(connection, None)
        if entry is None:
            return
        entry[2] = None
        self._emptied += 1
        if self._emptied > REBUILD_FLOOR and 2 * self._emptied > len(self._heap):
            self._heap = [entry for entry in self._heap if entry[2] is not None]
            heapq.heapify(self._heap)
            self._emptied = 0

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = math.inf

    def _arm(self, now: float) -> None:
        heap = self._heap
        if not heap:
            return
        deadline = heap[0][0]
        if self._timer is not None:
            if self._timer_at <= deadline:
                return
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._runtime.call_later(max(0.0, deadline - now), self._check)

    def _check(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        now = self._runtime.monotonic()
        while self._heap and self._heap[0][0] <= now:  # not a local: ``expired`` may rebuild the heap
            heap = self._heap
            entry = heap[0]
            link = entry[2]
            if link is None:
                heapq.heappop(heap)
                self._emptied -= 1
                continue
            connection = link.connection
            deadline = connection.last_received + entry[3]
            if now < deadline:  # a packet came: check again at the new deadline
                entry[0] = deadline
                heapq.heapreplace(heap, entry)
                continue
            heapq.heappop(heap)
            del self._entries[connection]
            self._expired(link)
        self._arm(now)
