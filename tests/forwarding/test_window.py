"""Window sizing from synthetic acknowledgement times."""

from __future__ import annotations

from appliance.forwarding.window import LinkEstimate


def feed(estimate: LinkEstimate, rate: float, fixed: float, size: int, batches: int) -> None:
    """Simulate batches on a link of ``rate`` bytes/s and ``fixed`` seconds of round trip."""
    now = 0.0
    for _ in range(batches):
        n = estimate.window().messages
        acks = [now + fixed + (i + 1) * size / rate for i in range(n)]
        estimate.record([size] * n, acks, now)
        now = acks[-1]


def test_slow_link_gets_the_minimum_window() -> None:
    estimate = LinkEstimate()
    feed(estimate, rate=1200, fixed=0.05, size=300, batches=10)
    assert estimate.window().messages == 2
    assert abs(estimate.rate_bps - 1200) < 1 and abs(estimate.rtt_s - 0.05) < 1e-6


def test_fast_link_grows_by_doubling_to_nine_bdp() -> None:
    estimate = LinkEstimate()
    seen = []
    for _ in range(12):
        feed(estimate, rate=10_000_000, fixed=0.002, size=200, batches=1)
        seen.append(estimate.window().messages)
    assert seen[:4] == [4, 8, 16, 32], "at most doubling per batch"
    assert seen[-1] == int(9 * 0.002 * 10_000_000 / 200)  # 900 messages = 9 bandwidth-delay products


def test_a_burst_that_looks_fast_cannot_flood_the_link() -> None:
    estimate = LinkEstimate()
    estimate.record([300, 300], [0.0101, 0.0102], 0.01 - 0.0)  # both passed a token bucket's burst
    assert estimate.window().messages <= 4
    feed(estimate, rate=1200, fixed=0.05, size=300, batches=10)
    assert estimate.window().messages == 2


def test_progress_inside_a_batch_shrinks_the_window_after_the_link_slows() -> None:
    estimate = LinkEstimate()
    feed(estimate, rate=1_000_000, fixed=0.01, size=300, batches=10)
    fast = estimate.window().messages
    # The link drops to 1200 B/s: acks of the running batch come 0.25 s apart.
    times = [i * 0.25 for i in range(17)]
    for n in range(1, 18):
        estimate.record_progress([300] * n, times[:n])
    assert estimate.window().messages < fast / 10


def test_reset_forgets_the_link() -> None:
    estimate = LinkEstimate()
    feed(estimate, rate=1_000_000, fixed=0.01, size=300, batches=10)
    estimate.reset()
    assert estimate.window().messages == 2 and estimate.rate_bps is None
