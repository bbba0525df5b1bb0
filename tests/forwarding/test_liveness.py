"""Keep-alive that tells a slow link from a dead one (appliance/forwarding/liveness.py), on a fake clock."""

from __future__ import annotations

from appliance.forwarding.liveness import DEAD_AFTER, Liveness

KEEPALIVE = 1.0


def test_idle_is_always_alive_and_restarts_the_clock() -> None:
    watch = Liveness(KEEPALIVE, now=0.0)
    assert watch.alive(100.0, busy=False, send_queue_bytes=0)
    assert watch.alive(100.0 + DEAD_AFTER * KEEPALIVE, busy=True, send_queue_bytes=None), "the busy spell started at 100"
    assert not watch.alive(100.1 + DEAD_AFTER * KEEPALIVE, busy=True, send_queue_bytes=None)


def test_a_send_queue_that_drains_slowly_is_a_slow_link_not_a_dead_one() -> None:
    """16 kB behind a 9.6 kbit/s link: 13 s without a PUBACK, but the kernel's queue keeps shrinking."""
    watch = Liveness(KEEPALIVE, now=0.0)
    queued = 16_000
    for second in range(1, 14):
        queued -= 1200
        assert watch.alive(float(second), busy=True, send_queue_bytes=queued), second


def test_nothing_leaving_and_nothing_arriving_is_a_dead_link() -> None:
    watch = Liveness(KEEPALIVE, now=0.0)
    assert watch.alive(1.0, busy=True, send_queue_bytes=5000)
    assert watch.alive(1.5, busy=True, send_queue_bytes=5000)
    assert not watch.alive(1.6, busy=True, send_queue_bytes=5000)


def test_bytes_from_the_upstream_are_progress() -> None:
    watch = Liveness(KEEPALIVE, now=0.0)
    for t in (1.0, 2.0, 3.0):
        watch.received(t)
        assert watch.alive(t + 1.4, busy=True, send_queue_bytes=None)
    assert not watch.alive(3.0 + DEAD_AFTER * KEEPALIVE + 0.01, busy=True, send_queue_bytes=None)


def test_a_growing_send_queue_is_not_progress() -> None:
    watch = Liveness(KEEPALIVE, now=0.0)
    assert watch.alive(0.5, busy=True, send_queue_bytes=100)
    assert watch.alive(1.0, busy=True, send_queue_bytes=900)
    assert not watch.alive(1.6, busy=True, send_queue_bytes=2000)
