"""How much to put in one batch: a window sized to the measured link (bandwidth-delay product).

The pump sends one batch and waits for every acknowledgement before it reads the next one (so it can go
back to the highest priority in between). Each batch pays a fixed cost - the round trip and the per-batch
work on both ends - and then one serialization time per byte. For the link to be busy a fraction ``u`` of
the time the batch must take ``u / (1 - u)`` fixed costs to transmit: that is the bandwidth-delay product
scaled by 9 for 90 %. On a 9.6 kbit/s satellite link that is the minimum of two messages (so a
high-priority message waits for at most two), on a fast link hundreds.

Both terms are measured from acknowledgements: the time per byte from their spacing inside a batch (they
come back at the rate the slowest hop delivers), the fixed cost from the first one minus its own
serialization, plus the gap the pump itself leaves between batches (reading the next batch, committing
the checkpoint) when it has a backlog; all smoothed. A window may at most double from one batch to the next, so a batch that
slipped through a token bucket's burst allowance (acks close together: the link looks fast) cannot put a
minute of data in flight ahead of an alert. Pure: no I/O, the caller passes the times.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Window:
    messages: int
    bytes: int


def _smooth(old: float | None, sample: float, weight: float) -> float:
    return sample if old is None else old + weight * (sample - old)


class LinkEstimate:
    def __init__(
        self,
        utilization: float = 0.9,
        initial_messages: int = 2,
        min_messages: int = 2,
        max_messages: int = 1000,
        weight: float = 0.5,
    ) -> None:
        self.factor = utilization / (1 - utilization)
        self.initial_messages = initial_messages
        self.min_messages = min_messages
        self.max_messages = max_messages
        self.weight = weight
        self.reset()

    def reset(self) -> None:
        """Forget the measurements: a new connection may run over a different link (another cell, a
        modem that fell back to 2G), and a stale fast estimate would put a long batch ahead of alerts."""
        self.seconds_per_byte: float | None = None
        self.fixed_s: float | None = None
        self.gap_s = 0.0
        self.average_size: float | None = None
        self.last_batch = self.initial_messages

    @property
    def rate_bps(self) -> float | None:
        """Bottleneck rate in bytes per second, or None before the first measurement."""
        return 1 / self.seconds_per_byte if self.seconds_per_byte else None

    @property
    def rtt_s(self) -> float | None:
        """The fixed cost of a batch: round trip plus per-batch work on both ends."""
        return None if self.fixed_s is None else self.fixed_s + self.gap_s

    def note_gap(self, seconds: float) -> None:
        """The pump took ``seconds`` between two batches of a backlog (its own per-batch cost)."""
        self.gap_s = _smooth(self.gap_s if self.seconds_per_byte is not None else None, max(seconds, 0.0), self.weight)

    def record(self, sizes: list[int], ack_times: list[float], sent_at: float) -> None:
        """A batch of ``sizes`` bytes was written at ``sent_at``; its acks came at ``ack_times``."""
        if not sizes or len(ack_times) != len(sizes):
            return
        acks = sorted(ack_times)
        self.last_batch = len(sizes)
        self.average_size = _smooth(self.average_size, sum(sizes) / len(sizes), self.weight)
        if len(sizes) >= 2 and acks[-1] > acks[0]:
            sample = (acks[-1] - acks[0]) / sum(sizes[1:])
            self.seconds_per_byte = _smooth(self.seconds_per_byte, sample, self.weight)
        if self.seconds_per_byte is not None:
            fixed = max(acks[0] - sent_at - sizes[0] * self.seconds_per_byte, 1e-4)
            self.fixed_s = _smooth(self.fixed_s, fixed, self.weight)

    def target_messages(self) -> int | None:
        """The window the link calls for (``factor`` bandwidth-delay products), before the growth limit."""
        if self.seconds_per_byte is None or self.fixed_s is None or self.average_size is None:
            return None
        return int(self.factor * (self.fixed_s + self.gap_s) / self.seconds_per_byte / self.average_size)

    def record_progress(self, sizes: list[int], ack_times: list[float], every: int = 8) -> None:
        """Mid-batch: every ``every`` acks, update the time per byte from the latest ones, so a link
        that just got slower shrinks the window before the batch ends."""
        n = len(ack_times)
        if n < every + 1 or n % every:
            return
        span = ack_times[-1] - ack_times[-every - 1]
        if span > 0:
            self.seconds_per_byte = _smooth(self.seconds_per_byte, span / sum(sizes[-every:]), self.weight)

    def window(self) -> Window:
        target = self.target_messages()
        if target is None:
            return Window(self.initial_messages, 1 << 30)
        messages = min(target, 2 * self.last_batch, self.max_messages)
        return Window(max(messages, self.min_messages), 1 << 30)
