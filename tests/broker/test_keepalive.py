"""``keepalive.KeepAlive`` on the fake runtime: each connection closed exactly at its own deadline, traffic
moving the deadline, one runtime timer for all, and nothing left behind by connections that went; and
any sequence of connections, traffic, departures and time against a model of the rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.sessions.keepalive import REBUILD_FLOOR, KeepAlive
from appliance.broker.transport.connection import ClientConnection
from testing.campaigns import campaign
from testing.fake_runtime import FakeRuntime


class Link:
    def __init__(self, name: str, runtime: FakeRuntime) -> None:
        self.connection = ClientConnection(1 << 20, 0, name)
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
    keepalive.watch(quiet, 15.0, runtime.monotonic())
    keepalive.watch(chatty, 15.0, runtime.monotonic())
    runtime.advance(3)
    slow_start = runtime.monotonic()
    slow.traffic(runtime)
    keepalive.watch(slow, 90.0, runtime.monotonic())
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
        keepalive.watch(link, 90.0, runtime.monotonic())
    assert pending_timers(runtime) == 1
    short = Link("short", runtime)
    keepalive.watch(short, 1.5, runtime.monotonic())
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
        keepalive.watch(link, 65535 * 1.5, runtime.monotonic())
    for index in range(20_000):
        link = Link(f"gone{index}", runtime)
        keepalive.watch(link, 65535 * 1.5, runtime.monotonic())
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
        keepalive.watch(link, 10.0, runtime.monotonic())  # type: ignore[arg-type]
    runtime.advance(10)
    assert expired == ["c0"] and len(keepalive) == 0


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("watch"), st.integers(0, 7), st.sampled_from([0.5, 1.5, 15.0, 90.0])),
        st.tuples(st.just("traffic"), st.integers(0, 7), st.just(0.0)),
        st.tuples(st.just("forget"), st.integers(0, 7), st.just(0.0)),
        st.tuples(st.just("advance"), st.just(0), st.one_of(st.sampled_from([0.1, 0.25, 0.4, 0.5, 1.0, 1.4, 14.9, 15.0]),
                                                              st.floats(0.0, 30.0, allow_nan=False))),
    ),
    max_size=60,
)


@campaign(300, deadline=None)
@given(OPERATIONS)
def test_any_sequence_expires_exactly_the_silent_connections_at_their_deadlines(
        operations: list[tuple[str, int, float]]) -> None:
    """The rule, as a model: a watched connection that has not gone expires at last_received + seconds,
    not earlier and not later; one that went never expires; the heap stays bounded by what is watched."""
    runtime = FakeRuntime()
    expired: list[tuple[Link, float]] = []
    keepalive = KeepAlive(runtime, lambda link: expired.append((link, runtime.monotonic())))  # type: ignore[arg-type]
    links: dict[int, Link] = {}
    watched: dict[int, float] = {}  # index -> seconds, while watched and not expired
    for action, index, value in operations:
        if action == "watch":  # a new connection under this index; the one before it went
            if index in watched:
                keepalive.forget(links[index].connection)
            link = links[index] = Link(f"c{index}", runtime)
            keepalive.watch(link, value, runtime.monotonic())  # type: ignore[arg-type]
            watched[index] = value
        elif action == "traffic" and index in watched:
            links[index].traffic(runtime)
        elif action == "forget" and index in watched:
            keepalive.forget(links[index].connection)
            del watched[index]
        elif action == "advance":
            runtime.advance(value)
        for link, at in expired:
            index = int(link.connection.peer[1:])
            assert links.get(index) is link and index in watched, "a connection that went, or expired twice"
            assert at == link.connection.last_received + watched.pop(index)
        expired.clear()
        now = runtime.monotonic()
        assert all(now < links[index].connection.last_received + seconds for index, seconds in watched.items())
        assert len(keepalive) == len(watched)
        assert len(keepalive._heap) <= 2 * len(watched) + REBUILD_FLOOR + 1
