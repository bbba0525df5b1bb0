"""broker.db on real files: round trips, per-turn batching, crash safety (SIGKILL), bad and newer files."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.broker.persistence.store import (
    SCHEMA_VERSION,
    BrokerStore,
    CorruptDatabaseError,
    OutboundState,
    PersistenceError,
    RetainedMessage,
    SchemaTooNewError,
    StoredMessage,
    StoredSession,
    StoredWill,
    properties_from_blob,
    properties_to_blob,
)
from appliance.broker.routing.delivery import stored_packet_id
from appliance.broker.routing.topic_tree import SubscriptionOptions
from appliance.config import ConfigError
from appliance.gateway_config import load_config
from testing.campaigns import campaign
from tests.broker.old_databases import write_version_2

ROOT = Path(__file__).resolve().parents[2]
PROPERTIES = {
    "user_properties": [("k", "v"), ("k", "v2")],
    "correlation_data": b"\x00\xff",
    "content_type": "application/json",
    "message_expiry_interval": 30,
    "payload_format_indicator": 1,
}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "broker.db"


def count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as connection:
        return connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_everything_round_trips_through_a_reopen(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    will = StoredWill("dev/1/status", b"offline", qos=1, retain=True, properties={"content_type": "text/plain"}, delay_interval=5)
    store.save_session(StoredSession("dev1", 5, 3600, username="alice", disconnected_at=1700000000.5, will=will))
    store.save_session(StoredSession("dev2", 4, 0xFFFFFFFF))
    store.save_subscription("dev1", "a/+", SubscriptionOptions(2, True, True, 1, 42))
    store.save_subscription("dev1", "$share/g/b/#", SubscriptionOptions(1))
    message_id = store.add_message(StoredMessage("a/b", b"payload", PROPERTIES, expires_at=1700000100.0))
    first = store.enqueue("dev1", message_id, 1, retain=True, subscription_ids=[42, 7])
    second = store.enqueue("dev2", message_id, 2)
    store.add_inbound_qos2("dev1", 17)
    store.set_retained(RetainedMessage("a/b", b"kept", 1, {"content_type": "x"}, expires_at=None))
    store.commit()
    store.mark_publish_sent(second, 9)
    store.commit()
    store.close()

    reopened = BrokerStore.open(db_path)
    state = reopened.load()
    dev1, dev2 = state.sessions["dev1"], state.sessions["dev2"]
    assert dev1.session == StoredSession("dev1", 5, 3600, "alice", 1700000000.5, will)
    assert dev2.session.expiry_interval == 0xFFFFFFFF and dev2.session.will is None
    assert dev1.subscriptions == {
        "a/+": SubscriptionOptions(2, True, True, 1, 42),
        "$share/g/b/#": SubscriptionOptions(1),
    }
    # Never-sent deliveries are counted at load and read back by ``page``; sent ones are loaded.
    assert (dev1.outbound, dev1.queued, dev1.stored_bytes) == ([], 1, len(b"payload"))
    ((delivery, body),) = reopened.page("dev1", 0, 10)
    assert (delivery.seq, delivery.message_id, delivery.qos, delivery.retain, delivery.subscription_ids) == (
        first,
        message_id,
        1,
        True,
        (42, 7),
    )
    assert delivery.state is OutboundState.QUEUED and delivery.packet_id is None
    assert body == StoredMessage("a/b", b"payload", PROPERTIES, 1700000100.0)
    (sent,) = dev2.outbound
    assert (sent.state, sent.packet_id) == (OutboundState.PUBLISH_SENT, 9)
    assert (dev2.queued, dev2.stored_bytes) == (0, len(b"payload"))
    assert reopened.page("dev2", 0, 10) == []
    assert dev1.inbound_qos2 == {17}
    assert state.messages == {message_id: StoredMessage("a/b", b"payload", PROPERTIES, 1700000100.0)}
    assert state.retained == {"a/b": RetainedMessage("a/b", b"kept", 1, {"content_type": "x"}, None)}


def test_message_is_stored_once_and_freed_with_its_last_delivery(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    message_id = store.add_message(StoredMessage("t", b"x" * 1000))
    seqs = [store.enqueue(f"c{i}", message_id, 1) for i in range(3)]
    store.commit()
    assert count(db_path, "messages") == 1 and count(db_path, "outbound") == 3
    store.remove_delivery(seqs[0])
    store.remove_delivery(seqs[1])
    store.commit()
    assert count(db_path, "messages") == 1
    store.remove_delivery(seqs[2])
    store.commit()
    assert count(db_path, "messages") == 0 and count(db_path, "outbound") == 0


def test_work_that_cancels_out_within_a_turn_is_never_written(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    unreferenced = store.add_message(StoredMessage("t", b"no subscribers"))
    acked = store.add_message(StoredMessage("t", b"acked in the same turn"))
    seq = store.enqueue("c", acked, 1)
    store.mark_publish_sent(seq, 1)
    store.remove_delivery(seq)
    assert unreferenced != acked
    assert not store.has_pending
    store.commit()
    assert count(db_path, "messages") == 0 and count(db_path, "outbound") == 0


def test_state_changes_within_a_turn_update_the_buffered_row(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    store.save_session(StoredSession("c", 5, 60))
    seq = store.enqueue("c", store.add_message(StoredMessage("t", b"x")), 2)
    store.mark_publish_sent(seq, 5)
    store.mark_pubrel_sent(seq, 5)
    store.commit()
    (delivery,) = store.load().sessions["c"].outbound
    assert (delivery.seq, delivery.packet_id, delivery.state) == (seq, 5, OutboundState.PUBREL_SENT)


@st.composite
def progress_turns(draw: st.DrawFn) -> list[list[tuple[str, int, int]]]:
    """Turns of progress operations on 6 committed deliveries, each delivery's as the broker makes them:
    marks (packet id, QoS 2 PUBREL) and at most one removal, last; interleaved across deliveries, with
    session updates (a statement of another kind) anywhere between."""
    turns = []
    removed: set[int] = set()
    for _ in range(draw(st.integers(1, 3))):
        lanes = []
        for index in range(6):
            if index in removed:
                continue
            ops = [("mark", index, draw(st.integers(1, 9))) for _ in range(draw(st.integers(0, 2)))]
            if draw(st.booleans()):
                ops.append(("remove", index, 0))
                removed.add(index)
            lanes.append(ops)
        turn = [("session", 0, draw(st.integers(0, 9))) for _ in range(draw(st.integers(0, 2)))]
        while any(lanes):
            lane = draw(st.sampled_from([lane for lane in lanes if lane]))
            turn.append(lane.pop(0))
            if draw(st.integers(0, 5)) == 0:
                turn.append(("session", 0, draw(st.integers(0, 9))))
        turns.append(turn)
    return turns


@campaign(60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=progress_turns())
def test_a_turn_of_progress_writes_what_its_operations_say_in_order(tmp_path: Path,
                                                                      turns: list[list[tuple[str, int, int]]]) -> None:
    """The commit groups a turn's per-message UPDATEs and DELETEs into one statement each (two per turn
    instead of two per message); the rows must end as applying each operation in its order says."""
    path = tmp_path / f"{len(list(tmp_path.iterdir()))}.db"
    store = BrokerStore.open(path)
    store.save_session(StoredSession("c", 5, 60))
    # Half of them share a body in ``messages``, half have it in their row.
    seqs = [store.enqueue("c", store.add_message(StoredMessage("t", bytes([i]))), 2) for i in range(3)]
    seqs += [store.enqueue_message("c", 2, False, None, "t", bytes([i]), {}, None) for i in range(3, 6)]
    store.commit()
    expected: dict[int, tuple[int, OutboundState]] = {seq: (0, OutboundState.QUEUED) for seq in seqs}
    disconnected_at = None
    for turn in turns:
        for kind, index, value in turn:
            seq = seqs[index]
            if kind == "session":
                disconnected_at = float(value)
                store.set_disconnected("c", disconnected_at)
            elif kind == "remove":
                store.remove_delivery(seq)
                del expected[seq]
            elif expected[seq][1] is OutboundState.QUEUED:
                store.mark_publish_sent(seq, value)
                expected[seq] = (value, OutboundState.PUBLISH_SENT)
            else:
                store.mark_pubrel_sent(seq, expected[seq][0])
                expected[seq] = (expected[seq][0], OutboundState.PUBREL_SENT)
        store.commit()
    with closing(sqlite3.connect(path)) as connection:
        rows = connection.execute("SELECT seq, packet_id, state FROM outbound ORDER BY seq").fetchall()
        left = connection.execute("SELECT count(*) FROM messages").fetchone()[0]
        stored_disconnect = connection.execute("SELECT disconnected_at FROM sessions").fetchone()[0]
    store.close()
    assert [(seq, packet_id or 0, OutboundState(state)) for seq, packet_id, state in rows] == \
        [(seq, *expected[seq]) for seq in sorted(expected)]
    assert left == len([seq for seq in expected if seq in seqs[:3]])
    assert stored_disconnect == disconnected_at


def test_queue_order_is_enqueue_order_across_commits(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    store.save_session(StoredSession("c", 5, 60))
    expected = []
    for turn in range(5):
        for index in range(4):
            message_id = store.add_message(StoredMessage("t", f"{turn}.{index}".encode()))
            expected.append(store.enqueue("c", message_id, 1))
        store.commit()
    store.close()
    reopened = BrokerStore.open(db_path)
    assert reopened.load().sessions["c"].queued == 20
    page = reopened.page("c", 0, 100)
    assert [delivery.seq for delivery, _ in page] == expected
    assert [body.payload for _, body in page] == [f"{t}.{i}".encode() for t in range(5) for i in range(4)]
    # Paging goes on after a cursor, a page at a time.
    assert [delivery.seq for delivery, _ in reopened.page("c", expected[5], 3)] == expected[6:9]
    # Ids keep increasing after a reopen, so new entries sort after the old ones.
    assert reopened.enqueue("c", reopened.add_message(StoredMessage("t", b"new")), 1) > expected[-1]


def test_delete_session_then_new_session_in_the_same_turn(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    store.save_session(StoredSession("c", 5, 60, username="old"))
    store.save_subscription("c", "old/#", SubscriptionOptions(1))
    old_message = store.add_message(StoredMessage("old", b"1"))
    store.enqueue("c", old_message, 1)
    store.add_inbound_qos2("c", 3)
    store.commit()
    buffered_old = store.enqueue("c", store.add_message(StoredMessage("old", b"2")), 1)
    store.delete_session("c")  # clean start
    store.save_session(StoredSession("c", 5, 60, username="new"))
    store.save_subscription("c", "new/#", SubscriptionOptions(0))
    new_seq = store.enqueue("c", store.add_message(StoredMessage("new", b"3")), 1)
    store.commit()
    loaded = store.load().sessions["c"]
    assert loaded.session.username == "new"
    assert list(loaded.subscriptions) == ["new/#"]
    assert [d.seq for d, _ in store.page("c", 0, 10)] == [new_seq] and new_seq != buffered_old
    assert loaded.inbound_qos2 == set()
    assert count(db_path, "messages") == 1


def test_a_sessions_sends_in_queue_order_are_one_mark_read_back_as_in_flight_after_a_reopen(db_path: Path) -> None:
    """``mark_sent_through`` writes one ``outbound_sent`` row per session, not an UPDATE per row; the next
    opening writes it into the rows: every row of that session up to the mark is in flight with its
    sequence number's packet id, the ones after it are queued, other sessions' rows are untouched, and the
    mark is gone. A mark of a row still in the buffer goes into the row (no mark)."""
    store = BrokerStore.open(db_path)
    for client_id in ("c", "other"):
        store.save_session(StoredSession(client_id, 5, 60))
    seqs = [store.enqueue_message("c", 1, False, None, "t", str(index).encode(), {}, None) for index in range(4)]
    other = store.enqueue_message("other", 1, False, None, "t", b"o", {}, None)
    store.commit()
    store.mark_sent_through("c", seqs[0])
    store.mark_sent_through("c", seqs[1])
    fresh = store.enqueue_message("other", 1, False, None, "t", b"fresh", {}, None)
    store.mark_sent_through("other", fresh)  # in the buffer: into its row
    store.commit()
    with closing(sqlite3.connect(db_path)) as connection:
        assert connection.execute("SELECT client_id, seq FROM outbound_sent").fetchall() == [("c", seqs[1])]
        assert connection.execute("SELECT count(*) FROM outbound WHERE state != 0").fetchone() == (1,)
    store.close()
    reopened = BrokerStore.open(db_path)
    with closing(sqlite3.connect(db_path)) as connection:
        assert connection.execute("SELECT count(*) FROM outbound_sent").fetchone() == (0,)
    state = reopened.load()
    in_flight = [(d.seq, d.packet_id, d.state) for d in state.sessions["c"].outbound]
    sent = OutboundState.PUBLISH_SENT
    assert in_flight == [(seqs[0], stored_packet_id(seqs[0]), sent), (seqs[1], stored_packet_id(seqs[1]), sent)]
    assert state.sessions["c"].queued == 2
    assert [d.seq for d, _ in reopened.page("c", 0, 10)] == seqs[2:]
    assert [(d.seq, d.packet_id) for d in state.sessions["other"].outbound] == [(fresh, stored_packet_id(fresh))]
    assert [d.seq for d, _ in reopened.page("other", 0, 10)] == [other]


def test_a_deleted_session_takes_its_sent_mark_with_it(db_path: Path) -> None:
    """Clean start after sends: the old session's mark goes (committed or buffered), so a new session of
    that client id starts with none."""
    store = BrokerStore.open(db_path)
    store.save_session(StoredSession("c", 5, 60))
    first = store.enqueue_message("c", 1, False, None, "t", b"1", {}, None)
    second = store.enqueue_message("c", 1, False, None, "t", b"2", {}, None)
    store.commit()
    store.mark_sent_through("c", first)
    store.commit()
    store.mark_sent_through("c", second)
    store.delete_session("c")
    store.save_session(StoredSession("c", 5, 60))
    store.commit()
    assert count(db_path, "outbound_sent") == 0 and count(db_path, "outbound") == 0


def test_sessions_subscriptions_inbound_and_retained_can_be_removed(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    store.save_session(StoredSession("c", 5, 60))
    store.save_subscription("c", "a", SubscriptionOptions(1))
    store.add_inbound_qos2("c", 1)
    store.add_inbound_qos2("c", 1)  # a duplicate PUBLISH before PUBREL is harmless
    store.set_retained(RetainedMessage("r", b"v", 0))
    store.commit()
    store.set_disconnected("c", 123.0)
    store.delete_subscription("c", "a")
    store.remove_inbound_qos2("c", 1)
    store.delete_retained("r")
    store.commit()
    state = store.load()
    assert state.sessions["c"].session.disconnected_at == 123.0
    assert state.sessions["c"].subscriptions == {} and state.sessions["c"].inbound_qos2 == set()
    assert state.retained == {}


def test_clear_will_keeps_the_session_and_forgets_only_its_will(db_path: Path) -> None:
    """A published will is cleared so that a restart does not publish it a second time."""
    store = BrokerStore.open(db_path)
    will = StoredWill("status/c", b"gone", qos=1, properties={"content_type": "text/plain"}, delay_interval=30)
    store.save_session(StoredSession("c", 5, 60, "u", disconnected_at=123.0, will=will))
    store.save_subscription("c", "a", SubscriptionOptions(1))
    store.commit()
    store.clear_will("c")
    store.commit()
    loaded = store.load().sessions["c"]
    assert loaded.session == StoredSession("c", 5, 60, "u", 123.0, None)
    assert loaded.subscriptions == {"a": SubscriptionOptions(1)}
    store.close()


def test_a_version_1_database_is_migrated_and_forgets_only_the_wills_of_away_clients(db_path: Path) -> None:
    """Version 1 kept an away client's will after publishing it; kept, version 2 would publish it again.
    Version 1 had version 2's tables."""
    write_version_2(db_path, with_rows=False)
    with closing(sqlite3.connect(db_path)) as connection, connection:
        for client_id, disconnected_at in (("away", 123.0), ("connected", None)):
            connection.execute("INSERT INTO sessions VALUES (?, 5, 60, NULL, ?, 'status/x', X'676F6E65', 1, 0, NULL, 0)",
                               (client_id, disconnected_at))
        connection.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    will = StoredWill("status/x", b"gone", qos=1)

    store = BrokerStore.open(db_path)
    sessions = store.load().sessions
    store.close()
    assert sessions["away"].session == StoredSession("away", 5, 60, None, 123.0, None)
    assert sessions["connected"].session.will == will
    with closing(sqlite3.connect(db_path)) as connection:
        assert connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)


def test_a_version_2_database_is_migrated_with_nothing_lost(db_path: Path) -> None:
    """Version 3 keeps a message queued for one session in its ``outbound`` row; version 2 kept every body
    in ``messages`` (tests/broker/data/broker-v2.sql, written by the version 2 gateway). Migrated, the file
    reads back whole: sessions with their will, subscriptions, the deliveries in flight and the queued ones
    with their bodies, the inbound QoS 2 id, the retained message; new ids follow the old ones, and the
    shared bodies are still freed with their last entry."""
    write_version_2(db_path)
    store = BrokerStore.open(db_path)
    state = store.load()
    with closing(sqlite3.connect(db_path)) as connection:
        assert connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    shared = [StoredMessage("q/shared", f"shared {index}".encode(),
                            {"content_type": "text/plain", "user_properties": [("k", f"v{index}")]}) for index in range(3)]
    expiring = StoredMessage("q/expiring", b"expires in a day", {}, 1700086400.0)
    exactly_once = StoredMessage("x/2", b"exactly once")
    assert set(state.sessions) == {"away", "busy", "publisher"}
    away, busy = state.sessions["away"], state.sessions["busy"]
    assert busy.session == StoredSession("busy", 4, 0xFFFFFFFF, None, None, StoredWill("status/busy", b"offline", 1, True))
    assert away.session == StoredSession("away", 5, 3600, None, 1700000000.0, None)
    assert away.subscriptions == {"q/#": SubscriptionOptions(1, subscription_identifier=5), "x/#": SubscriptionOptions(2)}
    assert busy.subscriptions == {"q/#": SubscriptionOptions(1), "x/#": SubscriptionOptions(2)}
    sent, released = OutboundState.PUBLISH_SENT, OutboundState.PUBREL_SENT
    assert [(d.seq, d.qos, d.packet_id, d.state) for d in busy.outbound] == [
        (4, 1, 2, sent), (6, 1, 3, sent), (8, 1, 4, sent), (10, 2, 5, released)]
    assert [state.messages[d.message_id] for d in busy.outbound if d.message_id] == [*shared[1:], expiring, exactly_once]
    assert (away.queued, away.stored_bytes) == (5, 3 * 8 + 16 + 12)
    page = store.page("away", 0, 10)
    assert [(d.seq, d.qos, d.subscription_ids, d.packet_id) for d, _ in page] == [
        (1, 1, (5,), None), (3, 1, (5,), None), (5, 1, (5,), None), (7, 1, (5,), None), (9, 2, (), None)]
    assert [body for _, body in page] == [*shared, expiring, exactly_once]
    assert state.sessions["publisher"].inbound_qos2 == {11}
    assert state.retained == {"kept/state": RetainedMessage("kept/state", b"on", 1, {"content_type": "text/plain"})}

    assert store.enqueue_message("away", 1, False, None, "q/new", b"new", {}, None) == 11
    assert store.add_message(StoredMessage("q/two", b"for two")) == 6
    for seq in (1, 3, 4, 5, 6, 7, 8, 9, 10):
        store.remove_delivery(seq)
    store.commit()
    store.close()
    assert count(db_path, "messages") == 0 and count(db_path, "outbound") == 1


def test_a_version_3_database_is_migrated_with_its_rows_as_they_were(db_path: Path) -> None:
    """Version 4 only adds ``outbound_sent``: a version 3 file's rows, sent and queued, read back as before."""
    store = BrokerStore.open(db_path)
    store.save_session(StoredSession("c", 5, 60))
    sent = store.enqueue_message("c", 1, False, None, "t", b"sent", {}, None, packet_id=9)
    queued = store.enqueue_message("c", 1, False, None, "t", b"queued", {}, None)
    store.commit()
    store.close()
    with closing(sqlite3.connect(db_path)) as connection, connection:
        connection.execute("DROP TABLE outbound_sent")
        connection.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    reopened = BrokerStore.open(db_path)
    loaded = reopened.load().sessions["c"]
    assert [(d.seq, d.packet_id, d.state) for d in loaded.outbound] == [(sent, 9, OutboundState.PUBLISH_SENT)]
    assert [d.seq for d, _ in reopened.page("c", 0, 10)] == [queued]
    reopened.mark_sent_through("c", queued)
    reopened.commit()
    assert count(db_path, "outbound_sent") == 1
    with closing(sqlite3.connect(db_path)) as connection:
        assert connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)


def test_a_migration_that_fails_leaves_the_file_as_it_was_and_says_so(db_path: Path) -> None:
    """A file the migration cannot rewrite (here a table in the way of the rebuild; in the field a full
    disk) is not a corrupt one: the error says what failed and that nothing changed, not "move it away"."""
    write_version_2(db_path)
    with closing(sqlite3.connect(db_path)) as connection, connection:
        connection.execute("CREATE TABLE outbound_v3 (x)")
    with pytest.raises(PersistenceError, match=f"cannot migrate the broker database from schema version 2 to {SCHEMA_VERSION}") as caught:
        BrokerStore.open(db_path)
    assert not isinstance(caught.value, CorruptDatabaseError) and "unchanged" in str(caught.value)
    with closing(sqlite3.connect(db_path)) as connection:
        assert connection.execute("SELECT value FROM meta").fetchone() == ("2",)
        assert connection.execute("SELECT count(*) FROM outbound WHERE message_id IS NOT NULL").fetchone() == (9,)
        assert connection.execute("SELECT count(*) FROM messages").fetchone() == (5,)


def test_a_message_queued_for_one_session_is_one_row_and_one_for_several_is_stored_once(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    store.save_session(StoredSession("c", 5, 60))
    body = StoredMessage("a/b", b"payload", PROPERTIES, 1700000100.0)
    own = store.enqueue_message("c", 1, True, [42, 7], body.topic, body.payload, body.properties, body.expires_at)
    plain = store.enqueue_message("c", 2, False, None, "t", b"plain", {}, None)
    sent = store.enqueue_message("c", 1, False, None, "t", b"sent", {}, None, packet_id=9)
    buffered = [b for _, b in store.page("c", 0, 10)]  # read back before the commit, from the buffer
    assert buffered == [body, StoredMessage("t", b"plain")] and all(type(b.payload) is bytes for b in buffered)
    store.commit()
    assert count(db_path, "messages") == 0 and count(db_path, "outbound") == 3
    loaded = store.load().sessions["c"]
    (in_flight,) = loaded.outbound
    assert (in_flight.seq, in_flight.message_id, in_flight.packet_id, in_flight.state) == (sent, None, 9, OutboundState.PUBLISH_SENT)
    assert in_flight.body == StoredMessage("t", b"sent")
    assert (loaded.queued, loaded.stored_bytes) == (2, len(b"payload") + len(b"plain") + len(b"sent"))
    assert [(d.seq, d.message_id, d.qos, d.retain, d.subscription_ids) for d, _ in store.page("c", 0, 10)] == [
        (own, None, 1, True, (42, 7)), (plain, None, 2, False, ())]
    assert [b for _, b in store.page("c", 0, 10)] == [body, StoredMessage("t", b"plain")]
    store.remove_delivery(own)
    store.remove_delivery(plain)
    store.remove_delivery(sent)
    store.commit()
    assert count(db_path, "outbound") == 0


def test_unsupported_property_value_is_refused_before_buffering(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    with pytest.raises(TypeError, match="float"):
        store.add_message(StoredMessage("t", b"x", {"weird": 1.5}))  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="pairs"):
        properties_to_blob({"user_properties": [("only-one",)]})  # type: ignore[list-item]
    assert not store.has_pending


def test_property_encoding_is_self_describing_json() -> None:
    blob = properties_to_blob(PROPERTIES)
    assert blob is not None and blob.startswith(b"{")
    assert properties_from_blob(blob) == PROPERTIES
    assert properties_to_blob({}) is None and properties_from_blob(None) == {}


@pytest.mark.parametrize(("level", "pragma_value"), [("normal", 1), ("full", 2)])
def test_wal_and_synchronous_level(db_path: Path, level: str, pragma_value: int) -> None:
    store = BrokerStore.open(db_path, synchronous=level)
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == pragma_value
    with sqlite3.connect(db_path) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(ValueError):
        BrokerStore.open(db_path, synchronous="off")


def test_garbage_file_gives_a_clear_error_and_is_left_alone(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    garbage = b"this is not an SQLite database\n" * 200
    db_path.write_bytes(garbage)
    with pytest.raises(CorruptDatabaseError, match="not a readable broker database"):
        BrokerStore.open(db_path)
    assert db_path.read_bytes() == garbage


def test_foreign_sqlite_file_is_refused(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as connection:
        connection.execute("CREATE TABLE something (x)")
    with pytest.raises(CorruptDatabaseError, match="no meta table"):
        BrokerStore.open(db_path)


def test_database_from_a_newer_gateway_is_refused(db_path: Path) -> None:
    BrokerStore.open(db_path).close()
    with sqlite3.connect(db_path) as connection:
        connection.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(SchemaTooNewError, match=f"schema version {SCHEMA_VERSION + 1}"):
        BrokerStore.open(db_path)


def test_failed_commit_keeps_the_changes_for_the_next_commit(db_path: Path) -> None:
    store = BrokerStore.open(db_path)
    store._db.execute("PRAGMA busy_timeout = 0")
    blocker = sqlite3.connect(db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    store.set_retained(RetainedMessage("r", b"v", 1))
    store.enqueue("c", store.add_message(StoredMessage("t", b"x")), 1)
    with pytest.raises(PersistenceError, match="commit failed"):
        store.commit()
    assert store.has_pending
    blocker.execute("ROLLBACK")
    blocker.close()
    store.commit()
    assert not store.has_pending
    assert count(db_path, "retained") == 1 and count(db_path, "outbound") == 1 and count(db_path, "messages") == 1


CRASH_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from appliance.broker.persistence.store import BrokerStore, RetainedMessage, StoredMessage, StoredSession

    store = BrokerStore.open(Path(sys.argv[1]))
    store.save_session(StoredSession("a", 5, 3600))
    store.save_session(StoredSession("b", 4, 3600))
    store.commit()
    turn = 0
    while True:
        turn += 1
        for index in range(20):
            message_id = store.add_message(StoredMessage("t", f"{turn}:{index}".encode()))
            store.enqueue("a", message_id, 1)
            store.enqueue("b", message_id, 2)
        store.set_retained(RetainedMessage("last", str(turn).encode(), 1))
        store.commit()
        print(turn, flush=True)  # acknowledged only after the commit returned
    """
)


def test_everything_committed_survives_sigkill(db_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(db_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        acknowledged = 0
        for line in child.stdout:
            acknowledged = int(line)
            if acknowledged >= 150:
                break
        child.send_signal(signal.SIGKILL)  # while it keeps writing
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert child.returncode == -signal.SIGKILL and acknowledged >= 150
    store = BrokerStore.open(db_path)
    last = int(store.load().retained["last"].payload)
    assert last >= acknowledged
    for client_id in ("a", "b"):
        payloads = [body.payload.decode() for _, body in store.page(client_id, 0, 1_000_000)]
        assert payloads == [f"{turn}:{index}" for turn in range(1, last + 1) for index in range(20)]
    with sqlite3.connect(db_path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_synchronous_level_comes_from_the_config_with_field_path_errors() -> None:
    assert load_config().broker.persistence.synchronous == "normal"
    full = load_config(overrides={"broker": {"persistence": {"synchronous": "full"}}})
    assert full.broker.persistence.synchronous == "full"
    with pytest.raises(ConfigError, match=r"^broker\.persistence\.synchronous: must be one of normal, full"):
        load_config(overrides={"broker": {"persistence": {"synchronous": "off"}}})
    with pytest.raises(ConfigError, match=r"^broker\.persistence\.fsync: unknown setting"):
        load_config(overrides={"broker": {"persistence": {"fsync": True}}})
