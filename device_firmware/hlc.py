"""Hybrid logical clock (Kulkarni et al. 2014) in the state store's string form.

Every state store version is an HLC `wall:counter:node`. The real clients zero-pad it
(`%015d:%05d:<node>`), so we do too, and we accept any width on input. The send and receive
rules below are the paper's; the receive rule refuses a peer more than `_MAX_DRIFT_MS` ahead so a
wrong clock elsewhere cannot drag ours into the future.
"""

import time
from micropython import const

_MAX_DRIFT_MS = const(60000)  # a stamp further ahead of our clock than this is refused



# The gateway's clock minus this device's, learned at every (re)connect (set_wall_ms); it starts as
# the epoch's offset, since some ports count seconds from 2000 and the state store counts from 1970.
_offset_ms = 946684800000 if time.gmtime(0)[0] == 2000 else 0


def wall_ms() -> int:
    """Milliseconds since the Unix epoch: the device's clock corrected by what the gateway said."""
    return time.time_ns() // 1000000 + _offset_ms


def set_wall_ms(wall: int) -> int:
    """Take the time from the gateway: from now on wall_ms() counts from wall. Returns how far
    off the clock was (ms, positive when it was behind). A board's RTC may be hours off (deployed
    in local time, or reset to 2000 by a power cut without a battery); the gateway's is the one
    the state store judges requests by."""
    global _offset_ms
    off = wall - wall_ms()
    _offset_ms += off
    return off


def parse(text) -> tuple:
    """`"wall:counter:node"` -> (wall, counter, node); ValueError if malformed."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode()
    parts = text.split(":", 2)
    if (len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]
            or len(parts[0]) > 18 or len(parts[1]) > 18):  # the gateway's bound (statestore-differences.md)
        raise ValueError("malformed HLC %r" % text)
    return int(parts[0]), int(parts[1]), parts[2]


class HLC:
    def __init__(self, node_id: str, clock=wall_ms):
        self.node_id = node_id
        self.clock = clock
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

    def resync(self) -> None:
        """After set_wall_ms: forget a wall time from a clock that ran ahead, or every stamp we
        send would stay in that future (send never goes back) and the store would refuse them."""
        now = self.clock()
        if self.wall > now:
            self.wall, self.counter = now, 0

    def receive(self, stamp) -> None:
        """Merge a stamp seen on a response or notification."""
        rwall, rcounter, _ = parse(stamp)
        now = self.clock()
        if rwall - now > _MAX_DRIFT_MS:
            raise ValueError("HLC %r is more than %d ms ahead" % (stamp, _MAX_DRIFT_MS))
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
