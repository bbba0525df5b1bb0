"""When the upstream link counts as dead: MQTT keep-alive that does not mistake a slow link for a dead one.

paho's own rule sends a PINGREQ after ``keepalive`` seconds without writing and gives up when the PINGRESP
has not come ``keepalive`` seconds later. On a link that suddenly got slow that PINGREQ waits behind
everything already in flight (a window sized for the fast link takes ``window bytes / slow rate`` to get
through), so that rule takes a slow link for a dead one and reconnects, which only makes the backlog, and
the alert behind it, wait longer. Measurements and history: docs/forwarding.md, "Store, pump, upstream"
(keep-alive on a slow link).

Rules
-----
* **Busy** (PUBLISHes unacknowledged, a PINGREQ out, or bytes still in the socket's send queue): the link
  is alive as long as it makes progress, that is a byte arrives from the upstream (a PUBACK) or TCP
  reports more of our bytes acknowledged (the kernel's ``tcpi_bytes_acked``). It is dead after
  ``DEAD_AFTER`` keep-alive periods (the factor the MQTT server itself allows the client, MQTT 5 section
  3.1.2.10) *plus one step of the link* without either.
* **Idle**: paho's PINGREQ/PINGRESP rule applies (it then has nothing to wait behind).
* **Before the CONNACK** the connection has ``connack_timeout_s`` from its start: paho's rule would give
  it one keep-alive, and a CONNECT queued behind the last connection's bytes on a slow link takes longer
  (a 1 s keep-alive at 9.6 kbit/s failed so).
* **A step** is the longest of the last ``RECENT_STEPS`` gaps between progress events while busy (what
  the link has just shown it needs) and of the caller's estimate from the measured rate (a frame and a
  PUBLISH at that rate, plus the round trip).

Theory of operation
-------------------
A slow link makes progress in steps, not continuously. Behind a relay or a proxy (a satellite modem's)
our TCP bytes are acknowledged at once and only PUBACKs tell that the link moves, and a PUBACK comes only
when the frame that ends its PUBLISH has crossed the link (a 1514-byte frame takes 1.26 s at 9.6 kbit/s).
Allowing one step beyond the keep-alive tolerance means a link that keeps making progress is never taken
for a dead one, however it slows down; a dead one is known one step later than a link that never showed
a step. Pure: no I/O; the caller passes the clock and what it read from the socket.
"""

from __future__ import annotations

import math
from collections import deque

#: Keep-alive periods without progress after which a busy link is dead (the server's own tolerance)...
DEAD_AFTER = 1.5
#: ... plus the longest of this many recent gaps between progress events (the link's step).
RECENT_STEPS = 8


class Liveness:
    def __init__(self, keepalive_s: float, now: float, connack_timeout_s: float = math.inf) -> None:
        self.keepalive_s = keepalive_s
        self.started_at = now
        self.connack_timeout_s = connack_timeout_s
        self.progress_at = now
        self._busy = False
        self._acked: int | None = None
        self._steps: deque[float] = deque(maxlen=RECENT_STEPS)

    def received(self, now: float) -> None:
        """Bytes arrived from the upstream."""
        self._progress(now)

    def _progress(self, now: float) -> None:
        if self._busy:
            self._steps.append(now - self.progress_at)
        self.progress_at = now

    def allowed_s(self, step_s: float = 0.0) -> float:
        """Seconds a busy link may go without progress: ``DEAD_AFTER`` keep-alives plus one step, the
        longer of ``step_s`` (the caller's estimate) and the longest recent gap."""
        return DEAD_AFTER * self.keepalive_s + max(step_s, max(self._steps, default=0.0))

    def alive(self, now: float, busy: bool, acked_bytes: int | None, step_s: float = 0.0) -> bool:
        """Called periodically. ``busy``: PUBLISHes unacknowledged or bytes unsent; ``acked_bytes``: the
        socket's count of bytes TCP has acknowledged (None where unknown); ``step_s``: the time the link
        is expected to need between two signs of progress at its measured rate (0 if unknown)."""
        if acked_bytes is not None and self._acked is not None and acked_bytes > self._acked:
            self._progress(now)
        self._acked = acked_bytes
        self._busy = busy
        if not busy:
            self.progress_at = now  # idle: the PINGREQ rule watches the link, and a busy spell starts the clock
            return True
        return now - self.progress_at <= self.allowed_s(step_s)

    def dead(self, now: float, busy: bool, acked_bytes: int | None, step_s: float, connected: bool) -> str | None:
        """Why the connection is dead at ``now`` (what the log says), or None while it lives: ``alive``'s
        rule, and before the CONNACK (``connected`` False) its timeout. Idle and connected, the caller
        applies paho's PINGREQ rule."""
        if not self.alive(now, busy, acked_bytes, step_s):
            return (f"no progress for {now - self.progress_at:.1f} s with data in flight "
                    f"(allowed {self.allowed_s(step_s):.1f} s): the link is dead")
        if not connected and now - self.started_at > self.connack_timeout_s:
            return f"no CONNACK within {self.connack_timeout_s:.0f} s"
        return None
