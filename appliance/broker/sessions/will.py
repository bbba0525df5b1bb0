"""Will messages waiting out their Will Delay Interval.

A will is published when a connection ends without a normal DISCONNECT (or with DISCONNECT 0x04), after
``min(will delay, session expiry)`` seconds (MQTT 5 3.1.3.2.2), and cancelled if the client reconnects
first. Sans-I/O: the broker asks ``due(now)`` from its periodic tick, so no timer handle per client.
"""

from __future__ import annotations

import heapq

from appliance.broker.codec.packets import Will
from appliance.broker.codec.properties import WILL_DELAY_INTERVAL


def will_delay(will: Will, session_expiry: int) -> int:
    delay: int = will.properties.get(WILL_DELAY_INTERVAL, 0)
    return min(delay, session_expiry)


class PendingWills:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._wills: dict[str, tuple[int, Will]] = {}
        self._counter = 0

    def __len__(self) -> int:
        return len(self._wills)

    def schedule(self, client_id: str, will: Will, due: float) -> None:
        self._counter += 1
        self._wills[client_id] = (self._counter, will)
        heapq.heappush(self._heap, (due, self._counter, client_id))

    def cancel(self, client_id: str) -> Will | None:
        entry = self._wills.pop(client_id, None)
        return entry[1] if entry else None

    def due(self, now: float) -> list[tuple[str, Will]]:
        """Pop every will whose time has come (entries cancelled or rescheduled meanwhile are skipped)."""
        ready: list[tuple[str, Will]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, counter, client_id = heapq.heappop(heap)
            entry = self._wills.get(client_id)
            if entry is not None and entry[0] == counter:
                del self._wills[client_id]
                ready.append((client_id, entry[1]))
        return ready
