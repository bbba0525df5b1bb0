"""The link model's arithmetic with made-up clocks: bucket, delivery times, loss draws, meter, validation."""

from __future__ import annotations

import random

import pytest

from hil_tests.rig.shaping import (
    MAX_RETRANSMISSIONS,
    DeliveryClock,
    LinkSettings,
    SettingsError,
    ThroughputMeter,
    TokenBucket,
    count_losses,
    segment_bytes,
    wire_bytes,
)


def test_bucket_starts_full_then_paces_at_the_rate():
    settings = LinkSettings(rate_bps=8000, burst_bytes=2000)  # 1000 bytes/s
    bucket = TokenBucket(settings, now=0.0)
    assert bucket.wait_time(2000, 0.0) == 0
    bucket.take(2000, 0.0)
    assert bucket.wait_time(500, 0.0) == pytest.approx(0.5)
    assert bucket.wait_time(500, 0.25) == pytest.approx(0.25)
    assert bucket.wait_time(500, 0.5) == 0


def test_bucket_never_holds_more_than_one_burst():
    bucket = TokenBucket(LinkSettings(rate_bps=8000, burst_bytes=2000), now=0.0)
    bucket.take(2000, 0.0)
    bucket.take(2000, 100.0)  # long idle: refilled to the burst, not to 100 s worth
    assert bucket.wait_time(1000, 100.0) == pytest.approx(1.0)


def test_reconfiguring_accrues_the_past_at_the_old_rate():
    bucket = TokenBucket(LinkSettings(rate_bps=8000, burst_bytes=2000), now=0.0)
    bucket.take(2000, 0.0)
    bucket.configure(LinkSettings(rate_bps=80000, burst_bytes=2000), now=0.5)  # 500 bytes earned so far
    assert bucket.wait_time(1500, 0.5) == pytest.approx(1000 / 10000)


def test_unshaped_bucket_never_waits():
    bucket = TokenBucket(LinkSettings(), now=0.0)
    bucket.take(10**9, 0.0)
    assert bucket.wait_time(10**9, 0.0) == 0


def test_delivery_clock_adds_delay_and_never_reorders():
    clock = DeliveryClock()
    rng = random.Random(1)
    settings = LinkSettings(delay_ms=100, jitter_ms=90)
    releases = [clock.release_time(i * 0.001, settings, rng, 0) for i in range(200)]
    assert releases == sorted(releases)
    assert all(0.010 <= r - i * 0.001 <= 0.190 + 0.2 for i, r in enumerate(releases))


def test_each_loss_costs_one_retransmission_timeout():
    settings = LinkSettings(delay_ms=150)
    assert settings.retransmission_timeout_ms == 300
    assert LinkSettings().retransmission_timeout_ms == 200
    clock = DeliveryClock()
    assert clock.release_time(1.0, settings, random.Random(0), losses=2) == pytest.approx(1.0 + 0.150 + 0.600)


def test_loss_draws_are_geometric_and_capped():
    rng = random.Random(5)
    assert all(count_losses(LinkSettings(), rng) == 0 for _ in range(100))
    draws = [count_losses(LinkSettings(loss_pct=50), rng) for _ in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(1.0, rel=0.05)  # p / (1 - p)
    assert max(count_losses(LinkSettings(loss_pct=99.99), rng) for _ in range(10)) == MAX_RETRANSMISSIONS


@pytest.mark.parametrize(
    ("rate_bps", "expected"),
    [(0, 65536), (9600, 64), (64000, 160), (10_000_000, 800)],
)
def test_segments_are_about_20_ms_of_the_rate_and_at_most_half_a_burst(rate_bps, expected):
    assert segment_bytes(LinkSettings(rate_bps=rate_bps)) == expected


def test_with_a_large_burst_segments_grow_to_one_mss():
    assert segment_bytes(LinkSettings(rate_bps=10_000_000, burst_bytes=100_000)) == 1460


def test_meter_counts_only_the_last_window():
    meter = ThroughputMeter(window=1.0)
    meter.add(1000, 0.0)
    meter.add(500, 0.6)
    assert meter.bits_per_second(0.9) == 12000
    assert meter.bits_per_second(1.5) == 4000
    assert meter.bits_per_second(3.0) == 0


@pytest.mark.parametrize(
    "changes",
    [{"rate_bps": -1}, {"rate_bps": 1.5}, {"burst_bytes": 1599}, {"delay_ms": -1}, {"loss_pct": 100}, {"up": 1}],
)
def test_settings_out_of_range_are_rejected(changes):
    with pytest.raises(SettingsError):
        LinkSettings().replace(**changes)


def test_leaving_rate_0_starts_with_a_full_bucket_as_tbf_does() -> None:
    """RATE 9600, drain, RATE 0 (unshaped), RATE 9600: a new shaper, so one burst passes at once."""
    shaped = LinkSettings(rate_bps=9600, burst_bytes=1600)
    bucket = TokenBucket(shaped, now=0.0)
    bucket.take(1600, now=0.0)
    assert bucket.wait_time(1600, now=0.0) > 1.0
    bucket.configure(LinkSettings(rate_bps=0, burst_bytes=1600), now=0.0)
    bucket.take(50_000, now=0.1)  # unshaped traffic spends nothing
    bucket.configure(shaped, now=0.1)
    assert bucket.wait_time(1600, now=0.1) == 0.0


def test_rate_counts_wire_bytes_headers_included_as_tc_does() -> None:
    assert wire_bytes(1448) == 1514  # one full Ethernet frame
    assert wire_bytes(1448 * 1000) == 1514 * 1000
    assert wire_bytes(100) == 105  # a share of a frame's headers, rounded up
    assert wire_bytes(0) == 0


def test_a_late_wake_up_does_not_cost_the_link_its_rate():
    """A relay starved of CPU wakes up long after its segment was due; tbf's kernel timer would have sent
    on time and kept sending, so the bytes behind the segment may leave at once, up to the lost time."""
    bucket = TokenBucket(LinkSettings(rate_bps=8000, burst_bytes=2000), now=0.0)  # 1000 bytes/s
    bucket.take(2000, 0.0)
    assert bucket.wait_time(500, 0.0) == pytest.approx(0.5)  # due at 0.5
    assert bucket.wait_time(500, 3.5) == 0  # asked again on waking up: the answer does not forget the due time
    bucket.take(500, 3.5, due=0.5)  # 3 s late: the link would have carried 3000 more bytes by now
    assert bucket.wait_time(3000, 3.5) == 0
    bucket.take(3000, 3.5)
    assert bucket.wait_time(500, 3.5) == pytest.approx(0.5)  # caught up: the rate again, no more


def test_idle_time_is_not_credited_beyond_the_burst():
    bucket = TokenBucket(LinkSettings(rate_bps=8000, burst_bytes=2000), now=0.0)
    bucket.take(2000, 0.0)
    assert bucket.wait_time(500, 0.0) > 0
    bucket.take(500, 0.5)  # on time: no credit
    bucket.take(2000, 100.0)  # idle for 99.5 s with nothing waiting: one burst
    assert bucket.wait_time(1000, 100.0) == pytest.approx(1.0)
