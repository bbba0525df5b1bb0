"""The durable store (real SQLite files): priority queues, TTL on read and in cleanup, one transaction,
bounded size. Priority/TTL cases follow Edge Hub's MessageStoreTest, adapted to one shared body per message."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from appliance.forwarding.messages import Message
from appliance.forwarding.queues import MessageStore, StoreFull, queue_name
from appliance.forwarding.routes import Endpoint, RouteResult

UP = Endpoint("upstream")
MOD = Endpoint("modules/m/inputs/i", "m", "i")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def msg(n: int, size: int = 10) -> Message:
    return Message("/messages/events", "devices/d/messages/events", bytes([n % 256]) * size, "d", properties=[("n", str(n))])


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> MessageStore:
    s = MessageStore(tmp_path / "forwarding.db", clock=clock)
    yield s
    s.close()


def read_all(store: MessageStore, endpoint: str, priority: int) -> list[int]:
    return [int(q.message.app_property("n")) for q in store.read(endpoint, priority, 0, 1000)]


def test_queue_names_follow_edge_hub() -> None:
    assert queue_name("upstream", 0) == "upstream_Pri0"


def test_one_body_many_queues_each_with_its_own_priority(store: MessageStore) -> None:
    seq, _ = store.add(msg(1), [RouteResult(UP, 0, 60), RouteResult(MOD, 3, 120)])
    assert store.message_count() == 1
    assert read_all(store, "upstream", 0) == [1] and read_all(store, MOD.id, 3) == [1]
    assert read_all(store, "upstream", 3) == []
    assert store.checkpoint("upstream", 0, seq, [seq]) == (1, 0)
    assert store.message_count() == 1, "still referenced by the module queue"
    assert store.checkpoint(MOD.id, 3, seq, [seq]) == (1, 0)
    assert store.message_count() == 0 and store.stored_bytes == 0


def test_a_store_made_after_one_was_lost_never_repeats_its_sequence_numbers(tmp_path: Path, clock: Clock) -> None:
    """The message id ``{gateway_id}:{seq}`` is the cloud's duplicate key: a store created after a factory
    reset (the old file gone) that numbered from 1 again would send ids the cloud already saw, and the
    cloud would drop those messages as duplicates."""
    first = MessageStore(tmp_path / "forwarding.db", clock=clock)
    old = [first.add(msg(n), [RouteResult(UP, 0, 60)])[0] for n in range(1, 4)]
    first.close()
    (tmp_path / "forwarding.db").unlink()
    clock.now += 1  # a second later
    second = MessageStore(tmp_path / "forwarding.db", clock=clock)
    new = [second.add(msg(n), [RouteResult(UP, 0, 60)])[0] for n in range(1, 4)]
    assert new == sorted(new) and min(new) > max(old), (old, new)
    second.close()
    reopened = MessageStore(tmp_path / "forwarding.db", clock=clock)  # a restart keeps counting
    assert reopened.add(msg(4), [RouteResult(UP, 0, 60)])[0] == new[-1] + 1
    reopened.close()


def test_message_and_entries_are_one_transaction(store: MessageStore) -> None:
    # Two results for the same queue violate the primary key on the second entry: nothing may remain.
    with pytest.raises(sqlite3.IntegrityError):
        store.add(msg(1), [RouteResult(UP, 0, 60), RouteResult(UP, 0, 60)])
    assert store.message_count() == 0 and store.depths() == [] and store.stored_bytes == 0


def test_ttl_checked_on_read(store: MessageStore, clock: Clock) -> None:
    """MessageStoreTest: messages with a short TTL are skipped by GetNext once expired, others still returned."""
    store.add(msg(1), [RouteResult(UP, 0, 10)])
    store.add(msg(2), [RouteResult(UP, 0, 100)])
    store.add(msg(3), [RouteResult(UP, 0, 10)])
    assert read_all(store, "upstream", 0) == [1, 2, 3]
    clock.now += 11
    assert read_all(store, "upstream", 0) == [2]


@pytest.mark.parametrize(("entire", "left"), [(True, [2]), (False, [2, 3])])
def test_cleanup_with_and_without_check_entire_queue(tmp_path: Path, clock: Clock, entire: bool, left: list[int]) -> None:
    store = MessageStore(tmp_path / "f.db", check_entire_queue_on_cleanup=entire, clock=clock)
    seqs = {n: store.add(msg(n), [RouteResult(UP, 0, ttl)])[0] for n, ttl in ((1, 10), (2, 100), (3, 10))}
    clock.now += 11
    expired = store.cleanup()
    remaining = [row[0] for row in store.db.execute("SELECT seq FROM entries ORDER BY seq")]
    assert remaining == [seqs[n] for n in left]
    assert expired[("upstream", 0)] == 3 - len(left)
    assert store.message_count() == len(left), "bodies nobody references are freed"
    store.close()


def test_cleanup_frees_expired_messages_of_an_endpoint_that_is_down(store: MessageStore, clock: Clock) -> None:
    for n in range(50):
        store.add(msg(n, 1000), [RouteResult(MOD, 5, 5)])
    before = store.stored_bytes
    clock.now += 6
    assert store.cleanup()[(MOD.id, 5)] == 50
    assert store.message_count() == 0 and store.stored_bytes == 0 < before


def test_checkpoint_counts_skipped_expired_entries_as_expired(store: MessageStore, clock: Clock) -> None:
    store.add(msg(1), [RouteResult(UP, 2, 10)])
    s2, _ = store.add(msg(2), [RouteResult(UP, 2, 100)])
    clock.now += 11
    batch = store.read("upstream", 2, 0, 10)
    assert [q.seq for q in batch] == [s2]
    assert store.checkpoint("upstream", 2, s2, [s2]) == (1, 1)
    assert store.checkpoint_of("upstream", 2) == s2


def test_snapshot_survives_reopen(tmp_path: Path, clock: Clock) -> None:
    store = MessageStore(tmp_path / "f.db", clock=clock)
    store.add(msg(1), [RouteResult(UP, 4, 30)])
    store.close()
    reopened = MessageStore(tmp_path / "f.db", clock=clock)
    [item] = reopened.read("upstream", 4, 0, 10)
    assert (item.priority, item.ttl_s, item.message.properties) == (4, 30, [("n", "1")])
    assert reopened.stored_bytes > 0
    reopened.close()


def test_read_respects_the_byte_window_but_returns_at_least_two(store: MessageStore) -> None:
    """Two, so that a packing sender gets two PUBACKs to measure the link by, however large the messages."""
    for n in range(5):
        store.add(msg(n, 100), [RouteResult(UP, 0, 60)])
    assert len(store.read("upstream", 0, 0, 10, max_bytes=350)) == 3
    assert len(store.read("upstream", 0, 0, 10, max_bytes=1)) == 2
    assert len(store.read("upstream", 0, 0, 1, max_bytes=1)) == 1


class TestBoundedStore:
    def make(self, tmp_path: Path, clock: Clock, limit: int) -> MessageStore:
        return MessageStore(tmp_path / "b.db", max_bytes=limit, clock=clock)

    def test_drops_oldest_of_lowest_priority_first(self, tmp_path: Path, clock: Clock) -> None:
        probe = self.make(tmp_path, clock, 10**9)
        probe.add(msg(0, 100), [RouteResult(UP, 9, 60)])
        one = probe.stored_bytes
        probe.close()
        (tmp_path / "b.db").unlink()
        store = self.make(tmp_path, clock, one * 4)
        store.add(msg(1, 100), [RouteResult(UP, 9, 60)])
        store.add(msg(2, 100), [RouteResult(UP, 0, 60)])
        store.add(msg(3, 100), [RouteResult(UP, 5, 60)])
        store.add(msg(4, 100), [RouteResult(UP, 9, 60)])
        _, dropped = store.add(msg(5, 100), [RouteResult(UP, 5, 60)])
        assert dropped == {("upstream", 9): 1}
        assert read_all(store, "upstream", 9) == [4]
        _, dropped = store.add(msg(6, 100), [RouteResult(UP, 0, 60)])
        assert dropped == {("upstream", 9): 1}
        _, dropped = store.add(msg(7, 100), [RouteResult(UP, 0, 60)])
        assert dropped == {("upstream", 5): 1}, "then the oldest of the next lowest priority"
        assert read_all(store, "upstream", 5) == [5]
        store.close()

    def test_never_drops_higher_priority_for_lower(self, tmp_path: Path, clock: Clock) -> None:
        store = self.make(tmp_path, clock, 4096)
        for n in range(6):
            store.add(msg(n, 500), [RouteResult(UP, 0, 60)])
        assert store.stored_bytes + 600 > 4096, "the store is full"
        depth_before, kept = store.depths(), read_all(store, "upstream", 0)
        with pytest.raises(StoreFull):
            store.add(msg(999, 500), [RouteResult(UP, 9, 60)])
        assert store.depths() == depth_before, "a refused message changes nothing"
        _, dropped = store.add(msg(7, 500), [RouteResult(UP, 0, 60)])
        assert dropped == {("upstream", 0): 1}, "within one priority the oldest goes"
        assert read_all(store, "upstream", 0) == kept[1:] + [7]
        store.close()


def test_add_many_commits_whole_messages_together_and_undoes_only_a_failing_one(tmp_path: Path, clock: Clock) -> None:
    """Group commit: one transaction for several messages; a message that cannot be stored (here: two
    entries for one queue, a constraint error) is rolled back alone, its neighbours still commit."""
    store = MessageStore(tmp_path / "forwarding.db", clock=clock)
    try:
        outcomes = store.add_many([
            (msg(1), [RouteResult(UP, 0, 60), RouteResult(MOD, 3, 60)]),
            (msg(2), [RouteResult(UP, 0, 60), RouteResult(UP, 0, 60)]),
            (msg(3), [RouteResult(UP, 0, 60)]),
        ])
        assert isinstance(outcomes[1], sqlite3.IntegrityError)
        assert isinstance(outcomes[0], tuple) and isinstance(outcomes[2], tuple)
        assert read_all(store, UP.id, 0) == [1, 3] and read_all(store, MOD.id, 3) == [1]
        stored = store.stored_bytes
    finally:
        store.close()
    reopened = MessageStore(tmp_path / "forwarding.db", clock=clock)  # committed for real, and counted right
    try:
        assert reopened.message_count() == 2 and reopened.stored_bytes == stored
    finally:
        reopened.close()


def test_add_many_store_full_refuses_one_message_and_keeps_what_it_would_have_dropped(tmp_path: Path, clock: Clock) -> None:
    store = MessageStore(tmp_path / "forwarding.db", max_bytes=2 * (1000 + 300), clock=clock)
    try:
        outcomes = store.add_many([
            (msg(1, 1000), [RouteResult(UP, 0, 60)]),
            (msg(2, 1000), [RouteResult(UP, 0, 60)]),
            (msg(3, 1000), [RouteResult(UP, 5, 60)]),  # only P0 to drop: refused, nothing dropped
        ])
        assert isinstance(outcomes[2], StoreFull)
        assert read_all(store, UP.id, 0) == [1, 2] and read_all(store, UP.id, 5) == []
    finally:
        store.close()


def test_dead_letters_keep_the_message_and_free_only_unreferenced_bodies(store: MessageStore, clock: Clock) -> None:
    both, alone = store.add(msg(1), [RouteResult(UP, 2, 60), RouteResult(MOD, 5, 60)])[0], store.add(msg(2), [RouteResult(UP, 2, 60)])[0]
    assert store.dead_letter("upstream", 2, [both, alone, 999], "Not authorized (0x87)") == 2
    assert store.read("upstream", 2, 0, 10) == []
    assert [m.seq for m in store.read(MOD.id, 5, 0, 10)] == [both], "the other endpoint still has its copy"
    assert store.message_count() == 1
    letters = store.dead_letters()
    assert [(d.seq, d.reason, d.message.app_property("n")) for d in letters] == [
        (both, "Not authorized (0x87)", "1"),
        (alone, "Not authorized (0x87)", "2"),
    ]
    assert letters[0].dead_ms == store.now_ms() and letters[0].priority == 2


def test_dead_letters_keep_the_newest_thousand(store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("appliance.forwarding.queues.MAX_DEAD_LETTERS", 3)
    seqs = [store.add(msg(n), [RouteResult(UP, 0, 60)])[0] for n in range(5)]
    for seq in seqs:
        store.dead_letter("upstream", 0, [seq], "refused")
    assert [d.seq for d in store.dead_letters()] == seqs[2:]
