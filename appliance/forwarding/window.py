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
minute of data in flight ahead of an alert.

A sender that packs several messages into one PUBLISH (the upstream batch format) asks for a
``packed_window`` instead: the same bandwidth-delay target, but in bytes, and at least two PUBLISHes of
``chunk_bytes`` each - two, so that the spacing of their acknowledgements keeps measuring the link, and
each at most half a second of it, so an alert arriving during a batch waits for little more than one.
Pure: no I/O, the caller passes the times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: How much later than the estimate an ack may come before the window shrinks at once (``record_progress``).
LATE_S = 0.25
#: On a reconnect the window's growth base is divided by this (``LinkEstimate.reconnected``).
RECONNECT_DECAY = 4
#: Batches whose fixed-cost samples are kept; their least (or the CONNACK's round trip) is the fixed cost.
FIXED_SAMPLES = 8
#: The least time per byte the estimate believes (10 Gbit/s): acks a few clock ticks apart, or none,
#: must not make the link infinitely fast (a window of infinity messages, a division by zero).
MIN_SECONDS_PER_BYTE = 8e-10
#: An Ethernet frame of a full TCP segment: a link delivers (and acknowledges) in frames, not bytes.
FRAME_BYTES = 1514


@dataclass(frozen=True, slots=True)
class Window:
    messages: int
    bytes: int | None = None  # payload bytes per batch; None: no limit but ``messages``
    chunk_bytes: int | None = None  # packing senders: payload bytes per PUBLISH


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
        self._fixed_samples: deque[float] = deque(maxlen=FIXED_SAMPLES)
        self._round_trip: float | None = None  # the CONNACK's
        self.gap_s = 0.0
        self.average_size: float | None = None
        self.last_batch = self.initial_messages
        self.last_batch_bytes: int | None = None
        self._measured_on_this_connection = False

    def reconnected(self) -> None:
        """A new connection: keep the measurements, and restart the window's growth base at the measured
        bandwidth-delay target divided by ``RECONNECT_DECAY``: the first window is half the target, the
        next may be whole.

        Forgetting everything restarted the window at two messages, and at most doubling per batch it
        needed ~9 batches - 15 s at a satellite link's 1.2 s round trips - to fill the link again after an
        outage, which is exactly when a backlog waits. A new connection may run over another link (a modem
        that fell back to 2G), so the old figures are not trusted whole: the window starts smaller, the
        acknowledgements re-measure the rate every 8 PUBLISHes and shrink it at once if the link got
        slower, and an alert waits for at most what is in flight (preemption)."""
        # The growth base: the measured bandwidth-delay target, decayed (the last batch was often only what
        # the queue held then, a few messages on a fast link, and no measure of the link).
        target_messages, target_bytes = self.target_messages(), self.target_bytes()
        if target_messages is not None and target_bytes is not None:
            self.last_batch = max(self.last_batch, target_messages)
            self.last_batch_bytes = max(self.last_batch_bytes or 0, int(target_bytes))
        self.last_batch = max(self.min_messages, self.last_batch // RECONNECT_DECAY)
        if self.last_batch_bytes is not None:
            self.last_batch_bytes = max(1, self.last_batch_bytes // RECONNECT_DECAY)
        self._round_trip = None  # the new connection's CONNACK brings its own
        self._measured_on_this_connection = False

    @property
    def rate_bytes_per_s(self) -> float | None:
        """Bottleneck rate in bytes per second, or None before the first measurement."""
        return 1 / self.seconds_per_byte if self.seconds_per_byte else None

    @property
    def fixed_s(self) -> float | None:
        """The fixed cost of a batch (round trip and per-batch work): the least of the last
        ``FIXED_SAMPLES`` batches' (first ack less its PUBLISH's serialization) and of the CONNACK's round
        trip. Least, not smoothed: waiting behind other bytes (a retransmission, another connection's
        queue, the other PUBLISHes a frame carries before its ack) only ever adds to a sample, and a fixed
        cost that took such waits in made the window grow with the queue it had itself filled (at
        9.6 kbit/s to 5 PUBLISHes, 2.5 s of the link, past what the HIL rig's queue holds)."""
        samples = [*self._fixed_samples, *(() if self._round_trip is None else (self._round_trip,))]
        return min(samples, default=None)

    @property
    def rtt_s(self) -> float | None:
        """The fixed cost of a batch: round trip plus per-batch work on both ends."""
        return None if self.fixed_s is None else self.fixed_s + self.gap_s

    def note_round_trip(self, seconds: float) -> None:
        """The CONNECT's round trip to its CONNACK: the fixed cost, measured before anything of ours is
        queued on the link. Known before the first batch, it tells a batch's serialization from its
        round trip even when the acks say nothing (``_seconds_per_byte_sample``)."""
        self._round_trip = seconds if self._round_trip is None else min(self._round_trip, seconds)

    def note_gap(self, seconds: float) -> None:
        """The pump took ``seconds`` between two batches of a backlog (its own per-batch cost).

        Ignored until a batch of this connection has been measured: the time since the last batch of the
        previous connection is the outage in between, not the pump's cost (taken as one, a minute-long
        outage once made every batch after it a minute of link long)."""
        if not self._measured_on_this_connection:
            return
        self.gap_s = _smooth(self.gap_s, max(seconds, 0.0), self.weight)

    def record(self, sizes: list[int], ack_times: list[float], sent_at: float, filled: bool = True) -> None:
        """A batch of ``sizes`` bytes was written at ``sent_at``; its acks came at ``ack_times``. ``filled``:
        the batch took the whole window (False: the queue had less to send)."""
        if not sizes or len(ack_times) != len(sizes):
            return
        acks = sorted(ack_times)
        if len(sizes) >= 2:
            # The base the window may double from. A batch that did not fill its window - a lone alert
            # that preempted a backlog, the few messages a fast link finds queued - says nothing about how
            # much the link takes and must not shrink it: after an outage the backlog would otherwise wait
            # for the window to double back from the few messages of the last batch before it (2 s per
            # doubling on a satellite link).
            self.last_batch = len(sizes) if filled else max(self.last_batch, len(sizes))
            total = sum(sizes)
            self.last_batch_bytes = total if filled or self.last_batch_bytes is None else max(self.last_batch_bytes, total)
        self.average_size = _smooth(self.average_size, sum(sizes) / len(sizes), self.weight)
        sample = self._seconds_per_byte_sample(sizes, acks, sent_at) if len(sizes) >= 2 else None
        if sample is not None:
            self.seconds_per_byte = max(_smooth(self.seconds_per_byte, sample, self.weight), MIN_SECONDS_PER_BYTE)
        if self.seconds_per_byte is not None:
            fixed = max(acks[0] - sent_at - sizes[0] * self.seconds_per_byte, 1e-4)
            self._fixed_samples.append(fixed)
            self._measured_on_this_connection = True

    def _seconds_per_byte_sample(self, sizes: list[int], acks: list[float], sent_at: float) -> float | None:
        """The time per byte a batch of two or more PUBLISHes shows: the spacing of its acks, but never less
        than the whole batch's time, less the known fixed cost, per byte.

        A link delivers in frames, and the PUBLISHes one frame ends are acknowledged together: at 9.6 kbit/s
        the two PUBLISHes of a batch often came back in one burst, 1.1 s after they were sent, and their
        spacing (none, or a few ms) measured a link hundreds of times too fast. The window then grew
        past what the link's queue holds (the HIL rig's tbf: 1 s at the rate), the queue dropped, and the
        TCP behind it stalled for its retransmission timeout (4.4 s, measured): an alert waited that
        long, and the bridge took the link for a dead one. The whole batch cannot have crossed faster than
        it did, so its time, less the fixed cost (from the CONNACK's round trip before the first batch),
        bounds the sample from below."""
        samples = []
        if acks[-1] > acks[0]:
            samples.append((acks[-1] - acks[0]) / sum(sizes[1:]))
        fixed = self.fixed_s
        if fixed is not None and acks[-1] - sent_at > fixed:
            samples.append((acks[-1] - sent_at - fixed) / sum(sizes))
        return max(samples, default=None)

    def target_bytes(self) -> float | None:
        """The bytes the link calls for in one batch (``factor`` bandwidth-delay products)."""
        fixed = self.fixed_s
        if self.seconds_per_byte is None or fixed is None:
            return None
        return self.factor * (fixed + self.gap_s) / self.seconds_per_byte

    def target_messages(self) -> int | None:
        """The window in messages, before the growth limit."""
        target = self.target_bytes()
        if target is None or self.average_size is None:
            return None
        return int(target / self.average_size)

    def progress_step_s(self, frame_bytes: int = FRAME_BYTES) -> float:
        """Seconds the link needs between two signs of progress (a PUBACK, a TCP acknowledgement): one
        full frame and one average PUBLISH at the measured rate, plus the round trip; 0 before a
        measurement (appliance/forwarding/liveness.py)."""
        if self.seconds_per_byte is None:
            return 0.0
        return (frame_bytes + (self.average_size or 0.0)) * self.seconds_per_byte + (self.rtt_s or 0.0)

    def record_progress(self, sizes: list[int], ack_times: list[float], every: int = 8, sent_at: float | None = None) -> None:
        """Mid-batch: every ``every`` acks, update the time per byte from the latest ones, so a link
        that just got slower shrinks the window before the batch ends. And at every ack, when the batch's
        acknowledged prefix (``sizes``, written from ``sent_at``) came more than ``LATE_S`` later than the
        estimate allows, take its pace at once: eight acks at 9.6 kbit/s take 4 s, and meanwhile every ack
        handed out another PUBLISH of a window sized for the fast link, ahead of any alert."""
        n = len(ack_times)
        if sent_at is not None and n and self.seconds_per_byte is not None:
            fixed = self.fixed_s or 0.0
            acked = sum(sizes[:n])
            elapsed = ack_times[-1] - sent_at
            if elapsed - (fixed + acked * self.seconds_per_byte) > LATE_S:
                self.seconds_per_byte = max(self.seconds_per_byte, (elapsed - fixed) / acked)
        if n < every + 1 or n % every:
            return
        span = ack_times[-1] - ack_times[-every - 1]
        if span > 0:
            self.seconds_per_byte = max(_smooth(self.seconds_per_byte, span / sum(sizes[-every:]), self.weight),
                                        MIN_SECONDS_PER_BYTE)

    def window(self) -> Window:
        target = self.target_messages()
        if target is None:
            return Window(self.initial_messages)
        messages = min(target, 2 * self.last_batch, self.max_messages)
        return Window(max(messages, self.min_messages))

    def packed_window(self, max_chunk_bytes: int, chunk_seconds: float = 0.5, initial_chunk_bytes: int = 512) -> Window:
        """The window of a packing sender: PUBLISHes of at most ``max_chunk_bytes`` and ``chunk_seconds`` of
        the measured rate (``initial_chunk_bytes`` before a measurement), at least two per batch."""
        rate = self.rate_bytes_per_s
        target = self.target_bytes()
        if rate is None or target is None or self.last_batch_bytes is None:
            chunk = min(max_chunk_bytes, initial_chunk_bytes)
            return Window(self.max_messages, 2 * chunk, chunk)
        chunk = min(max_chunk_bytes, max(1, int(rate * chunk_seconds)))
        # Both limits grow at most twofold per batch: a first batch that fit in a token bucket's burst
        # measures a link far faster than it is.
        total = min(max(2 * chunk, int(target)), 2 * self.last_batch_bytes)
        chunk = max(1, min(chunk, total // 2))
        # A whole number of PUBLISHes: a remainder would go out as a nearly empty one.
        return Window(self.max_messages, total // chunk * chunk, chunk)
