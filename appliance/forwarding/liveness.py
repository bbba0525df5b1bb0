"""When the upstream link counts as dead: MQTT keep-alive that does not mistake a slow link for a dead one.

paho's own rule sends a PINGREQ after ``keepalive`` seconds without writing and gives up when the PINGRESP
has not come ``keepalive`` seconds later. On a link that suddenly got slow that PINGREQ waits behind
everything already in flight - a window sized for the fast link takes ``window bytes / slow rate`` to get
through (16 kB at 9.6 kbit/s: 13 s) - so a 1 s keep-alive took a slow link for a dead one and reconnected,
which only made the backlog, and the alert behind it, wait longer.

So while the bridge is *busy* (PUBLISHes unacknowledged, or bytes still in the socket's send queue) the
link is alive as long as it makes progress: a byte arrives from the upstream (a PUBACK), or the kernel's
send queue shrinks (TCP acknowledgements: the bytes are leaving at whatever rate the link has). It is
dead after ``DEAD_AFTER`` keep-alive periods without either - the factor the MQTT server itself allows
the client (MQTT 5 section 3.1.2.10). While the bridge is idle the ordinary PINGREQ/PINGRESP rule
applies (paho's, which then has nothing to wait behind).

Pure: no I/O; the caller passes the clock and the send-queue size it read.
"""

from __future__ import annotations

#: Keep-alive periods without progress after which a busy link is dead (the server's own tolerance).
DEAD_AFTER = 1.5


class Liveness:
    def __init__(self, keepalive_s: float, now: float) -> None:
        self.keepalive_s = keepalive_s
        self.progress_at = now
        self._send_queue: int | None = None

    def received(self, now: float) -> None:
        """Bytes arrived from the upstream."""
        self.progress_at = now

    def alive(self, now: float, busy: bool, send_queue_bytes: int | None) -> bool:
        """Called periodically. ``busy``: PUBLISHes unacknowledged or bytes unsent; ``send_queue_bytes``:
        the socket's send queue (sent but not acknowledged by TCP, plus unsent), None where unknown."""
        if send_queue_bytes is not None and self._send_queue is not None and send_queue_bytes < self._send_queue:
            self.progress_at = now
        self._send_queue = send_queue_bytes
        if not busy:
            self.progress_at = now  # idle: the PINGREQ rule watches the link, and a busy spell starts the clock
            return True
        return now - self.progress_at <= DEAD_AFTER * self.keepalive_s
