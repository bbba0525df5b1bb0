"""Hybrid logical clocks: the versions of state store values and the fencing tokens.

An HLC is ``(wall_ms, counter, node_id)``: the wall part stays close to physical time (so versions mean
something to a human and clock skew can be bounded), the counter orders events inside one millisecond or
while the physical clock lags a remote one. The update rules are those of Kulkarni et al., "Logical
Physical Clocks and Consistent Snapshots in Globally Distributed Databases" (2014): ``tick`` is the
send/local-event rule and ``receive`` the receive rule, so a version returned for a request is always
greater than the request's own ``__ts``.

The text form is the one the Azure IoT Operations SDK clients produce and parse: ``%015d:%05d:<nodeId>``
(zero padded). Parsing accepts unpadded numbers too, because the protocol document's examples are
unpadded (``1696374425000:0:Client1``). Comparison is by wall time, then counter, then node id, which is a
total order, so fencing tokens from different nodes never tie ambiguously.

Pure: the physical clock is an argument, so tests drive time explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_DIGITS = 18


class HlcFormatError(ValueError):
    """The text is not ``<wall ms>:<counter>:<node id>``."""


@dataclass(frozen=True, slots=True, order=True)
class Hlc:
    wall_ms: int
    counter: int
    node_id: str

    def __str__(self) -> str:
        return f"{self.wall_ms:015d}:{self.counter:05d}:{self.node_id}"

    @classmethod
    def parse(cls, text: str) -> Hlc:
        parts = text.split(":", 2)
        if len(parts) != 3:
            raise HlcFormatError(f"expected <wall>:<counter>:<node>, got {text[:64]!r}")
        wall, counter, node_id = parts
        for number in (wall, counter):
            if not number.isascii() or not number.isdigit() or len(number) > MAX_DIGITS:
                raise HlcFormatError(f"not a non-negative integer: {number[:32]!r}")
        if not node_id:
            raise HlcFormatError("empty node id")
        return cls(int(wall), int(counter), node_id)


class HybridClock:
    """One node's clock. ``last`` is the greatest HLC it has issued; it never goes backwards."""

    def __init__(self, node_id: str, last: Hlc | None = None) -> None:
        self.node_id = node_id
        self.last = last if last is not None else Hlc(0, 0, node_id)

    def advance_to(self, seen: Hlc) -> None:
        """Never issue anything below ``seen`` (used at start-up with the greatest persisted version)."""
        if (seen.wall_ms, seen.counter) > (self.last.wall_ms, self.last.counter):
            self.last = Hlc(seen.wall_ms, seen.counter, self.node_id)

    def tick(self, physical_ms: int) -> Hlc:
        """A local or send event."""
        wall = max(self.last.wall_ms, physical_ms)
        counter = self.last.counter + 1 if wall == self.last.wall_ms else 0
        self.last = Hlc(wall, counter, self.node_id)
        return self.last

    def receive(self, remote: Hlc, physical_ms: int) -> Hlc:
        """A receive event: the result is greater than both ``remote`` and everything issued before."""
        previous = self.last.wall_ms
        wall = max(previous, remote.wall_ms, physical_ms)
        if wall == previous and wall == remote.wall_ms:
            counter = max(self.last.counter, remote.counter) + 1
        elif wall == previous:
            counter = self.last.counter + 1
        elif wall == remote.wall_ms:
            counter = remote.counter + 1
        else:
            counter = 0
        self.last = Hlc(wall, counter, self.node_id)
        return self.last
