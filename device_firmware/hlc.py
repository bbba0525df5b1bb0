"""Hybrid logical clock (Kulkarni et al. 2014) in the state store's string form.

Every state store version is an HLC `wall:counter:node`. The real clients zero-pad it
(`%015d:%05d:<node>`), so we do too, and we accept any width on input. The send and receive
rules below are the paper's; the receive rule refuses a peer more than `max_drift_ms` ahead so a
wrong clock elsewhere cannot drag ours into the future.
"""

import time

# Some ports count seconds from 2000, the state store counts from 1970.
_EPOCH_OFFSET_MS = 946684800000 if time.gmtime(0)[0] == 2000 else 0


def wall_ms() -> int:
    """Milliseconds since the Unix epoch (needs a set RTC/NTP on boards)."""
    return time.time_ns() // 1000000 + _EPOCH_OFFSET_MS


def parse(text) -> tuple:
    """`"wall:counter:node"` -> (wall, counter, node); ValueError if malformed."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode()
    parts = text.split(":", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
        raise ValueError("malformed HLC %r" % text)
    return int(parts[0]), int(parts[1]), parts[2]


class HLC:
    def __init__(self, node_id: str, clock=wall_ms, max_drift_ms: int = 60000):
        self.node_id = node_id
        self.clock = clock
        self.max_drift_ms = max_drift_ms
        self.wall = 0
        self.counter = 0

    def __str__(self) -> str:
        return "%015d:%05d:%s" % (self.wall, self.counter, self.node_id)

    def send(self) -> str:
        """Advance for a local or send event and return the stamp to put in `__ts`."""
        now = self.clock()
        if now > self.wall:
            self.wall, self.counter = now, 0
        else:
            self.counter += 1
        return str(self)

    def receive(self, remote) -> None:
        """Merge a stamp seen on a response or notification."""
        rwall, rcounter, _ = parse(remote)
        now = self.clock()
        if rwall - now > self.max_drift_ms:
            raise ValueError("HLC %r is more than %d ms ahead" % (remote, self.max_drift_ms))
        wall = max(self.wall, rwall, now)
        if wall == self.wall and wall == rwall:
            self.counter = max(self.counter, rcounter) + 1
        elif wall == self.wall:
            self.counter += 1
        elif wall == rwall:
            self.counter = rcounter + 1
        else:
            self.counter = 0
        self.wall = wall
