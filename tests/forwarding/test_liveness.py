"""Keep-alive that tells a slow link from a dead one (appliance/forwarding/liveness.py), on a fake clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from appliance.forwarding.liveness import DEAD_AFTER, RECENT_STEPS, Liveness
from appliance.forwarding.window import LinkEstimate
from testing.campaigns import campaign

KEEPALIVE = 1.0


def test_idle_is_always_alive_and_restarts_the_clock() -> None:
    watch = Liveness(KEEPALIVE, now=0.0)
    assert watch.alive(100.0, busy=False, acked_bytes=0)
    assert watch.alive(100.0 + DEAD_AFTER * KEEPALIVE, busy=True, acked_bytes=None), "the busy spell started at 100"
    assert not watch.alive(100.1 + DEAD_AFTER * KEEPALIVE, busy=True, acked_bytes=None)


def test_bytes_acknowledged_by_tcp_are_progress_even_while_the_send_queue_refills() -> None:
    """16 kB behind a 9.6 kbit/s link: 13 s without a PUBACK, but TCP acknowledges 1,200 bytes a second.
    The send queue's size says nothing here: each PUBLISH written meanwhile refills what was acknowledged."""
    watch = Liveness(KEEPALIVE, now=0.0)
    acked = 0
    for second in range(1, 14):
        acked += 1200
        assert watch.alive(float(second), busy=True, acked_bytes=acked), second


def test_nothing_acknowledged_and_nothing_arriving_is_a_dead_link() -> None:
    watch = Liveness(KEEPALIVE, now=0.0)
    assert watch.alive(1.0, busy=True, acked_bytes=5000)
    assert watch.alive(1.5, busy=True, acked_bytes=5000)
    assert not watch.alive(1.6, busy=True, acked_bytes=5000)


def test_bytes_from_the_upstream_are_progress() -> None:
    watch = Liveness(KEEPALIVE, now=0.0)
    for t in (1.0, 2.0, 3.0):
        watch.received(t)
        assert watch.alive(t + 1.4, busy=True, acked_bytes=None)
    # dead after 1.5 keep-alives plus the 1 s step those PUBACKs showed
    assert watch.alive(3.0 + DEAD_AFTER * KEEPALIVE + 1.0, busy=True, acked_bytes=None)
    assert not watch.alive(3.0 + DEAD_AFTER * KEEPALIVE + 1.01, busy=True, acked_bytes=None)


def test_pubacks_a_frame_apart_on_a_9600_link_keep_it_alive() -> None:
    """The HIL bridge rig's relay at 9.6 kbit/s (2026-11-24 trace): our bytes are acknowledged at once, and
    PUBACKs come in bursts as 1514-byte frames (1.26 s each) end PUBLISHes, 1.5-1.7 s apart. With 1.5
    keep-alives allowed, the bridge reconnected every few seconds on a link that never stopped."""
    watch = Liveness(KEEPALIVE, now=0.0)
    assert watch.alive(0.1, busy=True, acked_bytes=None)
    t = 0.0
    for gap in (1.3, 0.01, 1.6, 0.02, 1.7, 0.0, 1.65, 1.5, 0.01, 1.7):
        for tick in range(1, int(gap / 0.25) + 1):  # the bridge looks every 0.25 s
            assert watch.alive(t + tick * 0.25, busy=True, acked_bytes=None), (t, gap)
        t += gap
        watch.received(t)
    assert watch.alive(t + 1.6 + DEAD_AFTER * KEEPALIVE, busy=True, acked_bytes=None)
    assert not watch.alive(t + 1.71 + DEAD_AFTER * KEEPALIVE, busy=True, acked_bytes=None), "dead one step later"


def test_the_first_slow_gap_is_allowed_the_step_the_measured_rate_predicts() -> None:
    """No gap seen yet (a fresh connection, or the first PUBACK after the rate fell): the caller's
    estimate of a step at the measured rate counts."""
    estimate = LinkEstimate()
    estimate.record([600, 600, 600], [0.6, 1.1, 1.6], sent_at=0.0)  # ~1,200 bytes/s, like 9.6 kbit/s
    step = estimate.progress_step_s()
    assert 1.5 < step < 2.5, step  # a frame and a PUBLISH at 1,200 bytes/s, plus the round trip
    watch = Liveness(KEEPALIVE, now=0.0)
    assert watch.alive(0.1, busy=True, acked_bytes=None, step_s=step)
    assert watch.alive(DEAD_AFTER * KEEPALIVE + step, busy=True, acked_bytes=None, step_s=step)
    assert not watch.alive(DEAD_AFTER * KEEPALIVE + step + 0.01, busy=True, acked_bytes=None, step_s=step)
    assert LinkEstimate().progress_step_s() == 0.0, "nothing measured: no step"


def test_a_long_step_is_forgotten_after_recent_steps_shorter_ones() -> None:
    watch = Liveness(KEEPALIVE, now=0.0)
    watch.alive(0.0, busy=True, acked_bytes=None)
    watch.received(3.0)  # one 3 s step (a retransmission, say)
    assert watch.allowed_s() == DEAD_AFTER * KEEPALIVE + 3.0
    t = 3.0
    for _ in range(RECENT_STEPS):
        t += 0.2
        watch.received(t)
    assert abs(watch.allowed_s() - (DEAD_AFTER * KEEPALIVE + 0.2)) < 1e-9


def test_acknowledged_bytes_that_do_not_grow_are_not_progress() -> None:
    watch = Liveness(KEEPALIVE, now=0.0)
    assert watch.alive(0.5, busy=True, acked_bytes=100)
    assert watch.alive(1.0, busy=True, acked_bytes=100)
    assert not watch.alive(1.6, busy=True, acked_bytes=100)


# Hostile timing: any sequence of looks, PUBACKs and acknowledged-byte counts.
_EVENTS = st.lists(
    st.tuples(st.floats(0, 5), st.booleans(), st.one_of(st.none(), st.integers(0, 1 << 40)), st.booleans(), st.floats(0, 60)),
    max_size=60,
)


@campaign(300, deadline=None)
@given(_EVENTS)
def test_any_timing_keeps_the_rule_bounded_and_never_judges_a_link_that_just_made_progress(
    events: list[tuple[float, bool, int | None, bool, float]],
) -> None:
    """Whatever the clock, the counters and the caller's step say: no exception, the allowance stays 1.5
    keep-alives plus at most the time so far or the step it was given, and a link that made progress at
    this very moment is alive."""
    watch = Liveness(KEEPALIVE, now=0.0)
    now, longest = 0.0, 0.0
    for delta, busy, acked, arrived, step in events:
        now += delta
        longest = max(longest, now, step)  # no gap is longer than the time so far
        if arrived:
            watch.received(now)
        alive = watch.alive(now, busy, acked, step)
        assert DEAD_AFTER * KEEPALIVE <= watch.allowed_s(step) <= DEAD_AFTER * KEEPALIVE + longest + 1e-9
        if arrived or not busy:
            assert alive


def test_the_verdict_names_why_a_connection_is_dead() -> None:
    """``dead``: no progress while busy (whatever the CONNACK), or no CONNACK within its timeout."""
    watch = Liveness(KEEPALIVE, now=10.0, connack_timeout_s=10.0)
    assert watch.dead(19.0, busy=False, acked_bytes=None, step_s=0.0, connected=False) is None
    reason = watch.dead(20.5, busy=False, acked_bytes=None, step_s=0.0, connected=False)
    assert reason == "no CONNACK within 10 s"
    assert watch.dead(20.5, busy=False, acked_bytes=None, step_s=0.0, connected=True) is None
    # Idle at 20.5 restarted the clock: busy from then on, it is dead 1.5 keep-alives later.
    assert watch.dead(22.0, busy=True, acked_bytes=None, step_s=0.0, connected=True) is None
    reason = watch.dead(22.2, busy=True, acked_bytes=None, step_s=0.0, connected=True)
    assert reason is not None and reason.startswith("no progress for 1.7 s with data in flight (allowed 1.5 s)")
