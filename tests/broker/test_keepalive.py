"""``keepalive.KeepAlive`` on the fake runtime: each connection closed exactly at its own deadline, traffic
moving the deadline, one runtime timer for all, and nothing left behind by connections that went."""

from __future__ import annotations

from appliance.broker.connection import Connection
from appliance.broker.keepalive import REBUILD_FLOOR, KeepAlive
from tests.broker.pair import FakeRuntime


class Link:
    def __init__(self, name: str, runtime: FakeRuntime) -> None:
        self.connection = Connection(1 << 20, 0, name)
        self.connection.last_received = runtime.monotonic()
        self.connection.link = self

    def traffic(self, runtime: FakeRuntime) -> None:
        self.connection.last_received = runtime.monotonic()


def watcher(runtime: FakeRuntime) -> tuple[KeepAlive, list[tuple[str, float]]]:
    expired: list[tuple[str, float]] = []
    return KeepAlive(runtime, lambda link: expired.append((link.connection.peer, runtime.monotonic()))), expired


def pending_timers(runtime: FakeRuntime) -> int:
    return sum(1 for _, _, timer in runtime._timers if not timer.cancelled)


def test_each_connection_expires_at_its_own_deadline_and_traffic_moves_it() -> None:
    runtime = FakeRuntime()
    keepalive, expired = watcher(runtime)
    quiet, chatty, slow = Link("quiet", runtime), Link("chatty", runtime), Link("slow", runtime)
    keepalive.watch(quiet, 15.0)
    keepalive.watch(chatty, 15.0)
    runtime.advance(3)
    slow_start = runtime.monotonic()
    slow.traffic(runtime)
    keepalive.watch(slow, 90.0)
    runtime.advance(6)
    chatty.traffic(runtime)  # at 9: its deadline moves to 24
    runtime.advance(5.9)
    assert expired == []
    runtime.advance(0.1)
    assert expired == [("quiet", 15.0)]
    runtime.advance(8.9)
    assert expired == [("quiet", 15.0)]
    runtime.advance(0.1)
    assert expired == [("quiet", 15.0), ("chatty", 24.0)]
    runtime.advance(slow_start + 90.0 - runtime.monotonic())
    assert expired[-1] == ("slow", 93.0) and len(keepalive) == 0


def test_one_runtime_timer_serves_every_connection_and_an_earlier_deadline_moves_it() -> None:
    runtime = FakeRuntime()
    keepalive, expired = watcher(runtime)
    links = [Link(f"c{index}", runtime) for index in range(1000)]
    for link in links:
        keepalive.watch(link, 90.0)
    assert pending_timers(runtime) == 1
    short = Link("short", runtime)
    keepalive.watch(short, 1.5)
    assert pending_timers(runtime) == 1
    runtime.advance(1.5)
    assert expired == [("short", 1.5)]
    runtime.advance(88.5)
    assert len(expired) == 1001 and pending_timers(runtime) == 0


def test_connections_that_went_leave_nothing_behind() -> None:
    """Clients that connect and leave in a loop (keep-alive 65535 s, so nothing would fall due for 27 hours)
    cannot grow the heap: it is rebuilt once emptied entries are most of it."""
    runtime = FakeRuntime()
    keepalive, expired = watcher(runtime)
    staying = [Link(f"stay{index}", runtime) for index in range(10)]
    for link in staying:
        keepalive.watch(link, 65535 * 1.5)
    for index in range(20_000):
        link = Link(f"gone{index}", runtime)
        keepalive.watch(link, 65535 * 1.5)
        keepalive.forget(link.connection)
    assert len(keepalive) == 10
    assert len(keepalive._heap) <= 2 * (10 + REBUILD_FLOOR)
    assert not any(entry[2] is not None and entry[2].connection.peer.startswith("gone") for entry in keepalive._heap)
    runtime.advance(65535 * 1.5)
    assert sorted(name for name, _ in expired) == sorted(link.connection.peer for link in staying)


def test_a_connection_forgotten_while_expiring_others_is_not_expired() -> None:
    """``expired`` closes a connection; closing may end others (a session takeover) before their turn."""
    runtime = FakeRuntime()
    expired: list[str] = []
    links = [Link(f"c{index}", runtime) for index in range(3 * REBUILD_FLOOR)]

    def close(link: Link) -> None:
        expired.append(link.connection.peer)
        for other in links[1:]:
            keepalive.forget(other.connection)

    keepalive = KeepAlive(runtime, close)  # type: ignore[arg-type]
    for link in links:
        keepalive.watch(link, 10.0)  # type: ignore[arg-type]
    runtime.advance(10)
    assert expired == ["c0"] and len(keepalive) == 0
