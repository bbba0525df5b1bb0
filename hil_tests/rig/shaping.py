"""The link model: the settings a rig command changes, and the pure arithmetic of a shaped link.

Both backends and the serial protocol share `LinkSettings`, so a value the protocol accepts is a value
every backend understands. The token bucket, the per-segment delivery clock and the throughput meter take
the current time as an argument instead of reading a clock: the relay's timing rules can then be tested
with made-up times, and this module imports no asyncio and no sockets.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from dataclasses import dataclass

# tbf cannot pass a packet larger than its bucket, and a veth carries 1514-byte frames once GSO is capped
# at 1500 (see netns.py); 1600 leaves room for the frame and is the floor for both backends alike.
MIN_BURST_BYTES = 1600
MAX_BURST_BYTES = 16 * 1024 * 1024
MAX_RATE_BPS = 10_000_000_000
MAX_DELAY_MS = 60_000
# Linux's minimum retransmission timeout; the relay charges it for every lost transmission.
MIN_RTO_MS = 200
# A TCP sender gives up long before this many consecutive losses; the cap keeps a high LOSS finite.
MAX_RETRANSMISSIONS = 15
MSS_BYTES = 1460
# RATE counts bits on the wire, as tc does on the netns/bridge backends: a 1514-byte Ethernet frame carries
# 1448 bytes of TCP payload (Ethernet 14 + IPv4 20 + TCP 20 with the 12-byte timestamp option = 66 bytes of
# headers). The userspace relay moves payload, so it charges each segment its headers too.
WIRE_PAYLOAD_BYTES = 1448
WIRE_HEADER_BYTES = 66
UNSHAPED_SEGMENT_BYTES = 64 * 1024
MIN_SEGMENT_BYTES = 64
# A shaped segment is at most this long on the wire, so a short measurement window still sees many
# segments even at 9.6 kbit/s.
SEGMENT_SECONDS = 0.02


class SettingsError(ValueError):
    """A link setting is out of range; the message names the setting and the allowed range."""


@dataclass(frozen=True)
class LinkSettings:
    """One direction's shaping, applied to each direction of the link alike.

    ``rate_bps == 0`` means unshaped. ``delay_ms`` is one-way, so a round trip grows by twice the delay.
    """

    rate_bps: int = 0
    burst_bytes: int = MIN_BURST_BYTES
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    up: bool = True

    def __post_init__(self) -> None:
        _check_range("rate_bps", self.rate_bps, 0, MAX_RATE_BPS, integer=True)
        _check_range("burst_bytes", self.burst_bytes, MIN_BURST_BYTES, MAX_BURST_BYTES, integer=True)
        _check_range("delay_ms", self.delay_ms, 0, MAX_DELAY_MS)
        _check_range("jitter_ms", self.jitter_ms, 0, MAX_DELAY_MS)
        if not 0 <= self.loss_pct < 100:
            raise SettingsError(
                f"loss_pct must be at least 0 and below 100 (use DOWN to stop the link), got {self.loss_pct}"
            )
        if not isinstance(self.up, bool):
            raise SettingsError(f"up must be a bool, got {self.up!r}")

    def replace(self, **changes: object) -> LinkSettings:
        """A copy with ``changes`` applied; unknown names raise `SettingsError` rather than `TypeError`."""
        unknown = set(changes) - {field.name for field in dataclasses.fields(self)}
        if unknown:
            raise SettingsError(f"unknown link setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def retransmission_timeout_ms(self) -> float:
        """What one lost transmission costs: an RTO as a TCP sender would estimate it, never below 200 ms."""
        return max(MIN_RTO_MS, 2 * self.delay_ms + 4 * self.jitter_ms)


def _check_range(name: str, value: object, low: float, high: float, *, integer: bool = False) -> None:
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise SettingsError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not low <= value <= high:
        raise SettingsError(f"{name} must be between {low} and {high}, got {value}")


def segment_bytes(settings: LinkSettings) -> int:
    """How many bytes the relay reads and sends as one unit: small at low rates so shaping is smooth."""
    if settings.rate_bps == 0:
        return UNSHAPED_SEGMENT_BYTES
    by_time = int(settings.rate_bps / 8 * SEGMENT_SECONDS)
    # Half a burst at most, so the bucket can bank a late timer's worth of tokens instead of losing them.
    return max(MIN_SEGMENT_BYTES, min(by_time, MSS_BYTES, settings.burst_bytes // 2))


def count_losses(settings: LinkSettings, rng: random.Random) -> int:
    """How many times one segment is lost before a transmission gets through (geometric, capped)."""
    losses = 0
    while losses < MAX_RETRANSMISSIONS and rng.random() * 100 < settings.loss_pct:
        losses += 1
    return losses


def wire_bytes(payload_bytes: int) -> int:
    """Bytes on the wire for ``payload_bytes`` of a bulk TCP stream: its share of full frames' headers.

    Proportional rather than per relay segment: the relay cuts the stream into small segments at low rates
    (20 ms each), which TCP would send as full frames, so charging each one a frame's headers would halve
    the goodput at 9.6 kbit/s."""
    return -(-payload_bytes * (WIRE_PAYLOAD_BYTES + WIRE_HEADER_BYTES) // WIRE_PAYLOAD_BYTES)


class TokenBucket:
    """A byte bucket refilled at ``rate_bps / 8`` bytes per second up to ``burst_bytes``; starts full like tbf.

    Rules:
    - Idle time earns at most one burst, as tbf's bucket does.
    - A segment that had to wait leaves at its due time, even if the relay wakes up late (a starved
      process): tbf's dequeue timer is in the kernel and is never late, so the link keeps sending at
      ``rate`` while the relay is not scheduled. The link time lost to the late wake-up is kept as tokens
      above the burst (never more than the lateness times the rate), so the relay catches up instead of
      delivering less than ``rate`` on a busy machine.
    - The due time is the caller's: `wait_time` returns the wait, the sender keeps ``now + wait`` and
      hands it to `take`. It is not kept here, because the sender asks `wait_time` again when it wakes
      (the settings may have changed meanwhile), and that answer, 0, must not forget when the segment was
      due; and because several connections share a direction's bucket.
    """

    def __init__(self, settings: LinkSettings, now: float) -> None:
        self._rate_bytes = settings.rate_bps / 8
        self._burst = settings.burst_bytes
        self._tokens = float(settings.burst_bytes)
        self._updated = now

    def configure(self, settings: LinkSettings, now: float) -> None:
        """Change rate and burst: time until ``now`` accrues at the old rate, what follows at the new one.
        Leaving the unshaped state (``RATE 0``) is a new tbf: the bucket starts full."""
        self._refill(now)
        was_unshaped = self._rate_bytes == 0
        self._rate_bytes = settings.rate_bps / 8
        self._burst = settings.burst_bytes
        self._tokens = float(self._burst) if was_unshaped else min(self._tokens, self._burst)

    def wait_time(self, nbytes: int, now: float) -> float:
        """Seconds until ``nbytes`` may pass; 0 when they may pass now. A wait makes the sender backlogged:
        its segment is due at ``now`` plus the wait."""
        if self._rate_bytes == 0:
            return 0.0
        # Only `take` moves the bucket on: asked again after a late wake-up, this must not fill it to the
        # burst up to now, or `take` could not tell what the link sent between the due time and now.
        missing = min(nbytes, self._burst) - self._tokens_at(now)
        return max(0.0, missing / self._rate_bytes)

    def take(self, nbytes: int, now: float, due: float | None = None) -> None:
        """Spend tokens for bytes sent now (call when `wait_time` said 0). ``due``: when the segment was
        due, if it had to wait (the last `wait_time` that was not 0, plus ``now`` then); it is charged at
        that time, and the time between that and ``now`` is credited to the bytes behind it."""
        if self._rate_bytes == 0:
            return
        if due is not None and due < now:
            # From the due time, or from a take of another connection sharing the bucket since then.
            late_from = max(due, self._updated)
            self._refill(late_from)
            self._tokens += (now - late_from) * self._rate_bytes  # the link's time lost while the relay was late
            self._updated = now
        else:
            self._refill(now)
        self._tokens -= nbytes

    def _tokens_at(self, now: float) -> float:
        elapsed = max(0.0, now - self._updated)
        # Up to one burst, but a credit above it (see `take`) stays until it is spent.
        return max(self._tokens, min(self._burst, self._tokens + elapsed * self._rate_bytes))

    def _refill(self, now: float) -> None:
        self._tokens = self._tokens_at(now)
        self._updated = now


class DeliveryClock:
    """When each segment of one stream reaches the far side: send time + delay ± jitter + lost RTOs.

    Release times never go backwards, because a TCP stream is delivered in order: a late (jittered or
    retransmitted) segment holds back the ones behind it, as head-of-line blocking does on a real link.
    """

    def __init__(self) -> None:
        self._last = float("-inf")

    def release_time(self, sent_at: float, settings: LinkSettings, rng: random.Random, losses: int) -> float:
        one_way_ms = settings.delay_ms
        if settings.jitter_ms:
            one_way_ms = max(0.0, one_way_ms + rng.uniform(-settings.jitter_ms, settings.jitter_ms))
        penalty_ms = losses * settings.retransmission_timeout_ms
        self._last = max(self._last, sent_at + (one_way_ms + penalty_ms) / 1000)
        return self._last


class ThroughputMeter:
    """Bytes delivered within the last ``window`` seconds, as bits per second."""

    def __init__(self, window: float = 1.0) -> None:
        self._window = window
        self._samples: deque[tuple[float, int]] = deque()
        self._in_window = 0

    def add(self, nbytes: int, now: float) -> None:
        self._samples.append((now, nbytes))
        self._in_window += nbytes
        self._expire(now)

    def bits_per_second(self, now: float) -> float:
        self._expire(now)
        return self._in_window * 8 / self._window

    def _expire(self, now: float) -> None:
        while self._samples and self._samples[0][0] <= now - self._window:
            self._in_window -= self._samples.popleft()[1]
