"""Window sizing from synthetic acknowledgement times."""

from __future__ import annotations

import itertools

from hypothesis import example, given
from hypothesis import strategies as st

from appliance.forwarding.window import LinkEstimate
from testing.campaigns import campaign


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
    assert abs(estimate.rate_bytes_per_s - 1200) < 1 and abs(estimate.rtt_s - 0.05) < 1e-6


def test_fast_link_grows_by_doubling_to_nine_bdp() -> None:
    estimate = LinkEstimate()
    seen = []
    for _ in range(12):
        feed(estimate, rate=10_000_000, fixed=0.002, size=200, batches=1)
        seen.append(estimate.window().messages)
    assert seen[:4] == [4, 8, 16, 32], "at most doubling per batch"
    assert seen[-1] in (899, 900)  # 9 bandwidth-delay products, floored (float noise: 899.99...)


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
    assert estimate.window().messages == 2 and estimate.rate_bytes_per_s is None


def feed_packed(estimate: LinkEstimate, rate: float, fixed: float, batches: int, max_chunk: int = 2048) -> None:
    """Batches of a packing sender on a link of ``rate`` bytes/s: PUBLISHes of ``chunk_bytes`` each."""
    now = 0.0
    for _ in range(batches):
        window = estimate.packed_window(max_chunk)
        assert window.bytes is not None and window.chunk_bytes is not None
        sizes = [window.chunk_bytes] * max(1, window.bytes // window.chunk_bytes)
        acks = [now + fixed + sum(sizes[: i + 1]) / rate for i in range(len(sizes))]
        estimate.record(sizes, acks, now)
        now = acks[-1]


def test_packed_window_starts_with_two_small_publishes() -> None:
    window = LinkEstimate().packed_window(2048)
    assert (window.chunk_bytes, window.bytes) == (512, 1024)


def test_packed_window_on_a_slow_link_is_two_half_second_publishes() -> None:
    estimate = LinkEstimate()
    feed_packed(estimate, rate=1200, fixed=0.05, batches=10)
    window = estimate.packed_window(2048)
    assert window.chunk_bytes is not None and abs(window.chunk_bytes - 600) <= 1  # floor of 0.5 s at ~1,200 B/s
    assert window.bytes == 2 * window.chunk_bytes


def test_acks_that_come_back_in_one_burst_do_not_make_a_slow_link_look_fast() -> None:
    """9.6 kbit/s through a queue that delivers whole frames: the two PUBLISHes of each batch are
    acknowledged together, ~1.1 s after they were sent (HIL bridge rig, 2026-11-24). Their spacing said
    a link hundreds of times faster, and the window grew past what the link's queue holds."""
    estimate = LinkEstimate()
    estimate.note_round_trip(0.05)  # CONNECT to CONNACK
    now = 0.0
    for _ in range(12):
        n = estimate.window().messages
        burst = now + 0.05 + n * 600 / 1200  # every ack at once, when the last byte has crossed
        estimate.record([600] * n, [burst + i * 0.001 for i in range(n)], now)
        now = burst + 0.01
    assert estimate.window().messages == 2
    assert estimate.rate_bytes_per_s is not None and estimate.rate_bytes_per_s < 1300


def test_packed_window_on_a_fast_link_uses_full_publishes_and_nine_bdp() -> None:
    estimate = LinkEstimate()
    seen = []
    for _ in range(14):
        feed_packed(estimate, rate=10_000_000, fixed=0.002, batches=1)
        seen.append(estimate.packed_window(2048).bytes)
    assert all(b <= 2 * a for a, b in itertools.pairwise(seen)), "at most doubling per batch"
    window = estimate.packed_window(2048)
    assert window.chunk_bytes == 2048
    assert abs(window.bytes - 9 * 0.002 * 10_000_000) < 2048


def test_a_burst_cannot_make_the_publishes_huge_at_once() -> None:
    """Two publishes that both passed a token bucket's burst measure a link thousands of times too fast."""
    estimate = LinkEstimate()
    estimate.record([545, 545], [0.0431, 0.0432], 0.0)
    window = estimate.packed_window(1 << 20)
    assert window.bytes is not None and window.bytes <= 2 * 1090
    assert window.chunk_bytes is not None and window.chunk_bytes <= 1090


def test_a_lone_alert_between_backlog_batches_does_not_shrink_the_window() -> None:
    for packed in (False, True):
        estimate = LinkEstimate()
        (feed_packed if packed else feed)(estimate, rate=8000, fixed=0.05, batches=10, **({} if packed else {"size": 200}))
        before = estimate.packed_window(2048) if packed else estimate.window()
        estimate.record([90], [100.05 + 90 / 8000], 100.0)  # one small PUBLISH, one round trip + its bytes later
        after = estimate.packed_window(2048) if packed else estimate.window()
        assert after.messages >= before.messages
        assert (after.bytes, after.chunk_bytes) == (before.bytes, before.chunk_bytes)


def test_the_time_across_a_reconnect_is_not_a_gap_between_batches() -> None:
    estimate = LinkEstimate()
    feed_packed(estimate, rate=8000, fixed=0.05, batches=10)
    before = estimate.packed_window(2048)
    estimate.reset()  # the connection dropped; 73 s later it is back and the pump sends its next batch
    estimate.note_gap(73.0)
    feed_packed(estimate, rate=8000, fixed=0.05, batches=10)
    assert estimate.packed_window(2048) == before
    assert estimate.rtt_s is not None and estimate.rtt_s < 0.1


def test_a_batch_held_up_behind_a_stall_does_not_grow_the_window() -> None:
    """A batch that waited 3 s behind a retransmission timeout (or the last connection's queue): taken into
    a smoothed fixed cost, the wait made the next window several PUBLISHes of a 9.6 kbit/s link, past what
    its queue holds - more drops, more stalls."""
    estimate = LinkEstimate()
    feed(estimate, rate=1200, fixed=0.05, size=600, batches=10)
    estimate.record([600, 600], [3.05 + 0.5, 3.05 + 1.0], 0.0)
    assert estimate.window().messages == 2
    assert estimate.rtt_s is not None and estimate.rtt_s < 0.1


def test_a_reconnect_keeps_the_measured_link_and_restarts_the_window_at_half() -> None:
    """A satellite link (32 kB/s, 1.2 s round trip) after an outage: the window starts at half the last
    one instead of two messages and is whole again after one batch (before: ~9 doublings, ~15 s)."""
    estimate = LinkEstimate()
    feed(estimate, rate=32_000, fixed=1.2, size=600, batches=12)
    before = estimate.window().messages
    assert before > 100
    estimate.reconnected()
    estimate.note_round_trip(1.2)
    estimate.note_gap(60.0)  # the outage is not the pump's gap between batches
    assert before // 3 <= estimate.window().messages <= before // 2  # 2 x (last batch // RECONNECT_DECAY)
    feed(estimate, rate=32_000, fixed=1.2, size=600, batches=1)
    assert estimate.window().messages >= 0.99 * before  # whole again (2 x the first window)
    assert estimate.rtt_s is not None and estimate.rtt_s < 1.3


def test_a_reconnect_onto_a_slower_link_shrinks_the_window_with_its_first_batches() -> None:
    estimate = LinkEstimate()
    feed(estimate, rate=32_000, fixed=1.2, size=600, batches=12)
    estimate.reconnected()
    estimate.note_round_trip(1.2)
    feed(estimate, rate=1200, fixed=1.2, size=600, batches=4)  # the modem fell back to 9.6 kbit/s
    assert estimate.window().messages <= 9 * 1.2 * 1200 / 600 + 1  # nine bandwidth-delay products of the slow link


def test_batches_smaller_than_the_window_do_not_shrink_its_base() -> None:
    """A fast link that finds a few messages queued per batch, then an outage's backlog: the window may be
    the one the link was measured for at once, not two doublings past the last few messages."""
    estimate = LinkEstimate()
    feed(estimate, rate=32_000, fixed=1.2, size=600, batches=12)
    full = estimate.window().messages
    for start in range(3):  # demand-limited batches of 4 messages
        now = 100.0 + 10 * start
        estimate.record([600] * 4, [now + 1.2 + (i + 1) * 600 / 32_000 for i in range(4)], now, filled=False)
    assert estimate.window().messages >= 0.99 * full
    estimate.record([600] * 4, [200 + 1.2 + (i + 1) * 600 / 32_000 for i in range(4)], 200.0, filled=True)
    assert estimate.window().messages == 8, "a batch the window bounded is the new base"


def test_after_a_reconnect_the_window_restarts_from_the_measured_target_not_the_last_small_batch() -> None:
    """Before the outage the satellite link was fast for the load: each batch held the few messages that
    were queued. After it the backlog must not wait for the window to double up from those few."""
    estimate = LinkEstimate()
    feed(estimate, rate=32_000, fixed=1.2, size=600, batches=3)  # measured
    target = estimate.target_messages()
    assert target is not None and target > 100
    for start in range(10):  # 4 messages a batch, and the base follows them (filled)
        now = 100.0 + 10 * start
        estimate.record([600] * 4, [now + 1.2 + (i + 1) * 600 / 32_000 for i in range(4)], now, filled=True)
    estimate.reconnected()
    estimate.note_round_trip(1.2)
    assert estimate.window().messages >= target // 2 - 1


def test_a_late_ack_shrinks_the_window_at_once_when_the_link_drops() -> None:
    """The link falls from 1 MB/s to 9.6 kbit/s under a running batch: the first ack after the drop comes
    a second late. Waiting for eight acks (4 s at the new rate) kept handing out a fast link's window."""
    estimate = LinkEstimate()
    feed(estimate, rate=1_000_000, fixed=0.01, size=600, batches=10)
    fast = estimate.window()
    assert fast.messages > 20
    estimate.record_progress([600], [0.2], sent_at=0.0)  # late, but within LATE_S: loop delays, not the link
    assert estimate.window() == fast
    estimate.record_progress([600], [1.0], sent_at=0.0)
    assert estimate.window().messages == 2


@campaign(300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1, 70_000), min_size=1, max_size=20), st.floats(0, 100), st.booleans(),
                          st.sampled_from(["record", "progress", "reconnect", "round_trip"])), max_size=40))
@example([([1, 1, 1], 5e-324, False, "record")])  # acks a denormal apart: a link of infinite speed, before
@example([([1, 1], 5e-324, False, "record")])
def test_any_acknowledgement_timing_keeps_the_window_within_its_bounds(events: list[tuple[list[int], float, bool, str]]) -> None:
    """Hostile timing - acks before their batch, all at once, hours late, reconnects at any point: no
    exception, and the window stays between its minimum and maximum (a packed window too)."""
    estimate = LinkEstimate()
    now = 0.0
    for sizes, spread, filled, kind in events:
        acks = [now + spread * (i + 1) / len(sizes) for i in range(len(sizes))]
        if kind == "record":
            estimate.record(sizes, acks, now + spread / 2, filled)
        elif kind == "progress":
            estimate.record_progress(sizes, acks, sent_at=now)
        elif kind == "reconnect":
            estimate.reconnected()
        else:
            estimate.note_round_trip(spread)
        now += spread
        window = estimate.window()
        assert estimate.min_messages <= window.messages <= estimate.max_messages
        packed = estimate.packed_window(2048)
        assert packed.chunk_bytes is not None and packed.bytes is not None
        assert 1 <= packed.chunk_bytes <= 2048 and packed.bytes >= packed.chunk_bytes
        assert estimate.progress_step_s() >= 0
