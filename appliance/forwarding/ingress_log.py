"""Log lines for device messages refused at ingress, at most one per reason per interval.

A device stuck on a bad property sends it again and again, and a fleet of them can send thousands a
second: a line per message would fill the journal (and the SD card) and hide everything else. The first
refusal of a reason is logged at once - the operator sees the device, the topic and why - and later ones
of that reason at most once per ``interval_s``, with how many were not logged in between. The counters
(``refused`` in the metrics) count every one. The clock is an argument, so the limit is tested without
waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

#: Seconds between two lines of one reason.
INTERVAL_S = 60.0


class RefusalLog:
    def __init__(self, log: logging.Logger, clock: Callable[[], float], interval_s: float = INTERVAL_S) -> None:
        """``clock``: monotonic seconds (``Runtime.monotonic``)."""
        self.log = log
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def refused(self, reason: str, client_id: str, topic: str, detail: str, reason_code: int) -> bool:
        """Note one refusal; returns whether a line was written."""
        now = self.clock()
        last = self._last.get(reason)
        if last is not None and now - last < self.interval_s:
            self._held[reason] = self._held.get(reason, 0) + 1
            return False
        held = self._held.pop(reason, 0)
        self._last[reason] = now
        self.log.warning("forwarding: refused a message from %s on %.200r (reason code 0x%02X, %s): %s%s",
                         client_id, topic, reason_code, reason, detail,
                         f" ({held} more refused for {reason} since the last line)" if held else "")
        return True
