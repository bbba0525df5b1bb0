"""Offline queues of durable sessions live in ``broker.db``, not in memory: they are handed to the store,
read back a window at a time when the client returns (in order, each once), bounded by bytes
(``max_queued_bytes``), and a publisher whose message could not be queued hears 0x97 (MQTT 5).

The broker core on a fake clock with a real ``broker.db`` (``tests/broker/pair.py``)."""

from __future__ import annotations

import gc
import sqlite3
import tempfile
import tracemalloc
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.writer import encode
from appliance.broker.config import DEFAULT_QUEUED_BYTES_CAP, queued_bytes_default
from appliance.broker.persistence.storage import INLINE_PAYLOAD_BYTES
from appliance.broker.persistence.store import BrokerStore, StoredMessage
from testing.campaigns import campaign
from tests.broker.old_databases import write_version_2
from tests.broker.pair import BrokerPair, FakeClient
from tests.broker.versions import LEVELS, durable

EXPIRY = {pr.SESSION_EXPIRY_INTERVAL: 3600}


MEGABYTE = 1024 * 1024


@dataclass
class Kept:
    bytes: int = 0


@contextmanager
def allocations_kept() -> Iterator[Kept]:
    """The bytes of Python allocations the block leaves behind (tracemalloc, garbage collected before and
    after), in ``.bytes`` once it is done."""
    kept = Kept()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        yield kept
        gc.collect()
        kept.bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def away_subscriber(pair: BrokerPair, client_id: str = "away", qos: int = 1, level: int = pk.MQTT_5) -> None:
    """A durable session subscribed to ``q/#`` whose client has disconnected."""
    client = pair.client(level)
    client.connect(client_id, **durable(level, 3600))
    client.subscribe("q/#", qos)
    client.send(pk.Disconnect())
    client.received()


def publish(publisher: FakeClient, count: int, size: int = 16, first: int = 0, qos: int = 1) -> list[pk.Packet]:
    """``count`` QoS 1 messages whose payload starts with their index; returns the acknowledgements."""
    for index in range(first, first + count):
        payload = f"{index:08d}".encode().ljust(size, b".")
        publisher.send(pk.Publish("q/t", payload, qos, packet_id=index % 65535 + 1))
    return publisher.received()


def drain(client: FakeClient) -> list[pk.Publish]:
    """Acknowledge everything the client got until nothing more comes; returns the PUBLISHes in order."""
    got: list[pk.Publish] = []
    while True:
        publishes = [p for p in client.received() if isinstance(p, pk.Publish)]
        if not publishes:
            return got
        got += publishes
        client.send(*(pk.PubAck(p.packet_id or 0) for p in publishes if p.qos == 1))


def come_back(pair: BrokerPair, client_id: str = "away", properties: dict[int, int] | None = None,
              level: int = pk.MQTT_5) -> FakeClient:
    """The client reconnects to its session; what followed the CONNACK stays in its inbox."""
    client = pair.client(level)
    if level != pk.MQTT_5:
        properties = {}
    client.send(pk.Connect(level, client_id, False, 0, properties=EXPIRY if properties is None else properties))
    connack, *rest = client.received()
    assert isinstance(connack, pk.Connack) and connack.session_present
    client.inbox = rest
    return client


def indexes(publishes: list[pk.Publish]) -> list[int]:
    return [int(p.payload[:8]) for p in publishes]


def test_an_away_sessions_queue_is_in_the_store_and_comes_back_a_window_at_a_time(tmp_path: Path) -> None:
    """MQTT 5 here: its Receive Maximum sets the window the backlog comes back in."""
    pair = BrokerPair(tmp_path, max_inflight_messages=0)
    away_subscriber(pair)
    publisher = pair.connected("publisher")
    acks = publish(publisher, 2500)  # more than max_queued_messages (1000): that bound is for memory
    assert [a.reason_code for a in acks if isinstance(a, pk.PubAck)] == [0] * 2500
    session = pair.broker.sessions["away"]
    assert (len(session.queue), len(session.inflight), session.spilled) == (0, 0, 2500)

    back = come_back(pair, properties={**EXPIRY, pr.RECEIVE_MAXIMUM: 7})
    first = [p for p in back.received() if isinstance(p, pk.Publish)]
    assert indexes(first) == list(range(7))  # the window, no more
    assert len(session.inflight) == 7 and not session.queue
    back.send(*(pk.PubAck(p.packet_id or 0) for p in first))
    rest = drain(back)
    assert indexes(first + rest) == list(range(2500))
    assert session.spilled == 0 and not session.inflight and session.stored_bytes == 0
    pair.broker.flush()
    assert pair.store is not None and pair.store.page("away", 0, 10) == []


@pytest.mark.parametrize("level", LEVELS)
def test_the_backlog_is_read_back_before_its_commit_in_the_same_turn(tmp_path: Path, level: int) -> None:
    """Messages queued for an away client and its return in one read: the rows are still buffered (not
    committed) when the window is filled, and come from the buffer, once each, in order."""
    pair = BrokerPair(tmp_path)
    away_subscriber(pair, level=level)
    publisher = pair.connected("publisher")
    back = pair.client(level)
    session = pair.broker.sessions["away"]
    # One publisher read, then the reconnect before any flush: data_received without running the loop.
    frames = b"".join(encode(pk.Publish("q/t", f"{index:08d}".encode(), 1, packet_id=index + 1), pk.MQTT_5)
                      for index in range(30))
    pair.broker.data_received(publisher, frames)
    assert session.spilled == 30 and pair.store is not None and pair.store.has_pending
    reconnect = pk.Connect(level, "away", False, 0, properties=dict(EXPIRY) if level == pk.MQTT_5 else {})
    pair.broker.data_received(back, encode(reconnect, level))
    pair.runtime.run()
    got = drain(back)
    assert indexes(got) == list(range(30))


def test_a_client_that_leaves_with_a_queue_behind_its_window_frees_that_memory(tmp_path: Path) -> None:
    """MQTT 5 here: its Receive Maximum of 2 puts a queue behind the window."""
    pair = BrokerPair(tmp_path)
    subscriber = pair.client()
    subscriber.connect("slow", properties={**EXPIRY, pr.RECEIVE_MAXIMUM: 2})
    subscriber.subscribe("q/#", 1)
    publisher = pair.connected("publisher")
    publish(publisher, 10)
    session = pair.broker.sessions["slow"]
    assert len(session.inflight) == 2 and len(session.queue) == 8
    subscriber.drop()
    assert len(session.queue) == 0 and session.spilled == 8
    publish(publisher, 5, first=10)
    back = come_back(pair, "slow")
    got = drain(back)
    # The two in flight again (DUP), then the rest in order.
    assert indexes(got) == list(range(15)) and [p.dup for p in got[:2]] == [True, True]


@pytest.mark.parametrize("level", LEVELS)
def test_a_restart_reads_the_backlog_from_the_store_and_loads_none_of_it(tmp_path: Path, level: int) -> None:
    pair = BrokerPair(tmp_path)
    away_subscriber(pair, level=level)
    publisher = pair.connected("publisher")
    publish(publisher, 300, size=1000)
    pair.stop()

    restarted = BrokerPair(tmp_path)
    session = restarted.broker.sessions["away"]
    assert (len(session.queue), session.spilled, session.stored_bytes) == (0, 300, 300_000)
    back = come_back(restarted, "away", level=level)
    assert indexes(drain(back)) == list(range(300))
    assert session.stored_bytes == 0


def test_past_max_queued_bytes_mqtt5_publishers_get_quota_exceeded_and_the_drop_is_counted(tmp_path: Path) -> None:
    pair = BrokerPair(tmp_path, max_queued_bytes=1000, sys_interval=1)
    away_subscriber(pair)
    away_subscriber(pair, "roomy")  # a second subscriber whose queue has room: it still gets everything
    pair.broker.sessions["roomy"].byte_limit = 0
    publisher = pair.connected("publisher")
    acks = [a for a in publish(publisher, 15, size=100) if isinstance(a, pk.PubAck)]
    assert [a.reason_code for a in acks] == [0] * 10 + [rc.QUOTA_EXCEEDED] * 5
    publisher.send(pk.Publish("q/t", b"x" * 100, 2, packet_id=99))
    assert publisher.expect(pk.PubRec).reason_code == rc.QUOTA_EXCEEDED  # QoS 2: the exchange ends there
    assert 99 not in pair.broker.sessions["publisher"].inbound_qos2
    old = pair.client(pk.MQTT_311)  # 3.1.1 has no way to say so: acknowledged, dropped, counted
    old.connect("old-publisher")
    old.send(pk.Publish("q/t", b"y" * 100, 1, packet_id=1))
    assert old.expect(pk.PubAck).packet_id == 1

    watcher = pair.client()
    watcher.connect("watcher")
    watcher.subscribe("$SYS/broker/publish/messages/#", 0)
    watcher.received()
    pair.advance(1.5)
    sys_values = {p.topic: p.payload for p in watcher.received() if isinstance(p, pk.Publish)}
    assert sys_values["$SYS/broker/publish/messages/queue-full"] == b"7"
    assert sys_values["$SYS/broker/publish/messages/dropped"] == b"7"

    back = come_back(pair, "away")
    assert indexes(drain(back)) == list(range(10))  # the first ones are kept (mosquitto's order too)
    roomy = come_back(pair, "roomy")
    assert len(drain(roomy)) == 17


def test_the_byte_bound_counts_across_a_restart(tmp_path: Path) -> None:
    """MQTT 5 publishers: they are the ones told (0x97); a 3.1.1 one is acknowledged (above)."""
    pair = BrokerPair(tmp_path, max_queued_bytes=1000)
    away_subscriber(pair)
    publisher = pair.connected("publisher")
    publish(publisher, 6, size=100)
    pair.stop()
    restarted = BrokerPair(tmp_path, max_queued_bytes=1000)
    publisher = restarted.connected("publisher")
    acks = [a for a in publish(publisher, 6, size=100, first=6) if isinstance(a, pk.PubAck)]
    assert [a.reason_code for a in acks] == [0] * 4 + [rc.QUOTA_EXCEEDED] * 2


QUEUED_MEGABYTES = 32


def test_queued_messages_of_an_away_session_are_not_held_in_memory(tmp_path: Path) -> None:
    """32 x 1 MB queued for an away client: Python's allocations grow by a small fraction of that
    (the store's page cache and the turn's buffer, not the payloads; held payloads would be 32 MB, six
    times the bound). Version-free: run once, with MQTT 5. (100 MB wrote 100 MB to SQLite for the same
    verdict: the unit layer's longest test.)"""
    pair = BrokerPair(tmp_path, max_packet_size=2 * 1024 * 1024)
    away_subscriber(pair)
    publisher = pair.connected("publisher")
    with allocations_kept() as kept:
        for index in range(QUEUED_MEGABYTES):
            publisher.send(pk.Publish("q/t", f"{index:08d}".encode().ljust(MEGABYTE, b"."), 1, packet_id=index + 1))
            publisher.received()
        pair.broker.flush()
    assert pair.broker.sessions["away"].spilled == QUEUED_MEGABYTES
    assert kept.bytes < 5 * MEGABYTE, f"{kept.bytes / MEGABYTE:.1f} MB held for {QUEUED_MEGABYTES} MB queued"
    back = come_back(pair, "away")
    assert indexes(drain(back)) == list(range(QUEUED_MEGABYTES))


def test_a_session_that_stops_being_durable_takes_its_backlog_into_memory(tmp_path: Path) -> None:
    """MQTT 5 only: a session expiry of 0 on the return (3.1.1's clean session is the next test)."""
    pair = BrokerPair(tmp_path)
    away_subscriber(pair)
    publisher = pair.connected("publisher")
    publish(publisher, 5)
    back = come_back(pair, properties={})  # session expiry 0 from now on: the store forgets it
    assert indexes(drain(back)) == list(range(5))
    pair.broker.flush()
    assert pair.store is not None and pair.store.page("away", 0, 10) == []


@pytest.mark.parametrize("level", LEVELS)
def test_clean_start_forgets_the_backlog(tmp_path: Path, level: int) -> None:
    pair = BrokerPair(tmp_path)
    away_subscriber(pair, level=level)
    publisher = pair.connected("publisher")
    publish(publisher, 5)
    fresh = pair.client(level)
    fresh.connect("away", clean_start=True, properties=EXPIRY if level == pk.MQTT_5 else {})
    fresh.subscribe("q/#", 1)
    publish(publisher, 2, first=5)
    assert indexes(drain(fresh)) == [5, 6]


def test_buffered_rows_of_a_failed_commit_are_paged_too(tmp_path: Path) -> None:
    store = BrokerStore.open(tmp_path / "broker.db")
    first = store.enqueue("c", store.add_message(StoredMessage("t", b"committed")), 1)
    store.commit()
    second = store.enqueue("c", store.add_message(StoredMessage("t", b"failed batch")), 1)
    store._failed.append(store._take_batch())  # type: ignore[arg-type]  # as a failed commit leaves it
    third = store.enqueue("c", store.add_message(StoredMessage("t", b"this turn")), 1)
    store.enqueue("other", store.add_message(StoredMessage("t", b"not c")), 1)
    page = store.page("c", 0, 10)
    assert [(d.seq, body.payload) for d, body in page] == [
        (first, b"committed"), (second, b"failed batch"), (third, b"this turn")]
    assert [d.seq for d, _ in store.page("c", first, 1)] == [second]


@pytest.mark.parametrize(("free", "expected"), [(10**12, DEFAULT_QUEUED_BYTES_CAP), (400_000_000, 100_000_000), (0, 1)])
def test_the_default_byte_bound_is_a_share_of_free_space_with_a_cap(free: int, expected: int) -> None:
    assert queued_bytes_default(free) == expected



def test_a_connected_slow_consumer_with_nothing_in_flight_still_gets_its_backlog(tmp_path: Path) -> None:
    """A slow consumer's QoS 1 deliveries go to the store; with nothing in flight no acknowledgement
    would read them back, so they are read at once."""
    pair = BrokerPair(tmp_path)
    subscriber = pair.client()
    subscriber.connect("stuck", properties=EXPIRY)
    subscriber.subscribe("q/#", 1)
    pair.broker.sessions["stuck"].connection.overloaded = True  # type: ignore[union-attr]
    publisher = pair.connected("publisher")
    publish(publisher, 3)
    assert indexes(drain(subscriber)) == [0, 1, 2]


STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 25)),
        st.tuples(st.just("connect"), st.integers(1, 8)),
        st.tuples(st.just("disconnect"), st.integers(0, 1)),
        st.tuples(st.just("ack"), st.integers(0, 12)),
        st.tuples(st.just("overload"), st.integers(0, 1)),
        st.tuples(st.just("crash"), st.integers(0, 1)),
    ),
    max_size=30,
)


@campaign(60, deadline=None)
@given(steps=STEPS)
def test_every_acknowledged_message_arrives_in_order_and_only_dup_resends_repeat(steps: list[tuple[str, int]]) -> None:
    """A model check of the backlog: any interleaving of publishes, the subscriber coming and going (with
    any window), acknowledging some of what it has, being a slow consumer, and the broker crashing
    (everything uncommitted lost, as with kill -9) or stopping. At the end every acknowledged message has
    arrived, in publish order, and a message arrived again only as a DUP resend."""
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder)
        pair = BrokerPair(data, max_inflight_messages=0)
        away_subscriber(pair, "model")
        publisher = pair.connected("model-publisher")
        published = 0
        received: list[pk.Publish] = []
        unacked: list[pk.Publish] = []
        subscriber: FakeClient | None = None

        def collect() -> None:
            assert subscriber is not None
            for packet in subscriber.received():
                if isinstance(packet, pk.Publish):
                    received.append(packet)
                    unacked.append(packet)

        for action, value in steps:
            if action == "publish":
                acks = publish(publisher, value, first=published)
                assert [a.reason_code for a in acks if isinstance(a, pk.PubAck)] == [0] * value
                published += value
            elif action == "connect" and subscriber is None:
                unacked.clear()
                subscriber = pair.client()
                subscriber.send(pk.Connect(pk.MQTT_5, "model", False, 0,
                                           properties={**EXPIRY, pr.RECEIVE_MAXIMUM: value}))
                connack, *rest = subscriber.received()
                assert isinstance(connack, pk.Connack) and connack.session_present
                subscriber.inbox = rest
            elif action == "disconnect" and subscriber is not None:
                collect()
                if value:
                    subscriber.send(pk.Disconnect())
                else:
                    subscriber.drop()
                subscriber = None
            elif action == "ack" and subscriber is not None:
                collect()
                done, unacked[:] = unacked[: value], unacked[value:]
                if done:
                    subscriber.send(*(pk.PubAck(p.packet_id or 0) for p in done))
            elif action == "overload" and subscriber is not None:
                subscriber.congest(bool(value))
                if value:
                    subscriber.connection.overloaded = True
            elif action == "crash":
                if subscriber is not None:
                    collect()
                if value:
                    pair.stop()
                elif pair.store is not None:
                    pair.store.close()  # kill -9: the buffered changes are lost
                pair = BrokerPair(data, max_inflight_messages=0)
                publisher = pair.connected("model-publisher")
                subscriber = None
            if subscriber is not None:
                collect()
        if subscriber is not None:
            subscriber.send(pk.Disconnect())
            subscriber = None
        subscriber = come_back(pair, "model")
        while True:
            before = len(received)
            collect()
            if len(received) == before:
                break
            subscriber.send(*(pk.PubAck(p.packet_id or 0) for p in unacked))
            unacked.clear()
        pair.stop()
    seen: list[int] = []
    for packet in received:
        index = int(packet.payload[:8])
        if index in seen:
            assert packet.dup, f"message {index} delivered twice as a new message"
        else:
            seen.append(index)
    assert seen == list(range(published))


def test_a_broker_db_written_before_the_backlog_existed_is_read_back(tmp_path: Path) -> None:
    """A version 2 file (the backlog came with version 2; the gateway before it loaded every queued row)
    with queued rows (state 0) and an in-flight one (state 1) as below. They come back: the one in
    flight with DUP and its packet id, then the queued ones in order."""
    write_version_2(tmp_path / "broker.db", with_rows=False)
    with closing(sqlite3.connect(tmp_path / "broker.db")) as db, db:
        assert db.execute("SELECT value FROM meta").fetchone() == ("2",)
        db.execute("INSERT INTO sessions (client_id, protocol_level, expiry_interval, username, disconnected_at)"
                   " VALUES ('old', 5, 3600, NULL, 1700000000.0)")
        db.execute("INSERT INTO subscriptions VALUES ('old', 'q/#', 1, 0, 0, 0, NULL)")
        for index in range(5):
            db.execute("INSERT INTO messages (id, topic, payload) VALUES (?, 'q/t', ?)",
                       (index + 1, f"{index:08d}".encode()))
            db.execute("INSERT INTO outbound VALUES (?, 'old', ?, 1, 0, NULL, ?, ?)",
                       (index + 1, index + 1, 7 if index == 0 else None, 1 if index == 0 else 0))
    pair = BrokerPair(tmp_path)
    session = pair.broker.sessions["old"]
    assert (list(session.inflight), session.spilled, session.stored_bytes) == ([7], 4, 40)
    back = come_back(pair, "old")
    got = drain(back)
    assert indexes(got) == [0, 1, 2, 3, 4]
    assert (got[0].dup, got[0].packet_id) == (True, 7) and not any(p.dup for p in got[1:])


def test_a_small_message_for_one_session_is_one_row_and_a_large_or_shared_one_is_stored_once(tmp_path: Path) -> None:
    """Schema version 3: a message queued for one durable session is stored in its queue entry, unless it
    is large (``INLINE_PAYLOAD_BYTES``: the entry is rewritten when its PUBLISH goes out); one queued for
    several is stored once in ``messages``. Each comes back the same way."""
    pair = BrokerPair(tmp_path)
    away_subscriber(pair, "one")
    publisher = pair.client()
    publisher.connect("publisher")
    large = b"L" * (INLINE_PAYLOAD_BYTES + 1)
    publisher.send(pk.Publish("q/t", b"small", 1, packet_id=1), pk.Publish("q/t", large, 1, packet_id=2))
    away_subscriber(pair, "two")
    publisher.send(pk.Publish("q/t", b"for two", 1, packet_id=3))
    assert [a.reason_code for a in publisher.received() if isinstance(a, pk.PubAck)] == [0, 0, 0]
    with closing(sqlite3.connect(tmp_path / "broker.db")) as db:
        rows = db.execute("SELECT o.client_id, o.message_id IS NULL, coalesce(o.payload, m.payload) FROM outbound o"
                          " LEFT JOIN messages m ON m.id = o.message_id ORDER BY o.seq").fetchall()
        assert rows == [("one", 1, b"small"), ("one", 0, large), ("one", 0, b"for two"), ("two", 0, b"for two")]
        assert db.execute("SELECT count(*) FROM messages").fetchone() == (2,)
    assert [p.payload for p in drain(come_back(pair, "one"))] == [b"small", large, b"for two"]
    assert [p.payload for p in drain(come_back(pair, "two"))] == [b"for two"]
    pair.stop()
    with closing(sqlite3.connect(tmp_path / "broker.db")) as db:
        assert db.execute("SELECT (SELECT count(*) FROM outbound), (SELECT count(*) FROM messages)").fetchone() == (0, 0)


def test_a_version_2_broker_db_is_migrated_and_every_client_gets_what_it_was_owed(tmp_path: Path) -> None:
    """The file the version 2 gateway wrote (tests/broker/data/broker-v2.sql) under today's broker: the
    client connected at the crash gets its in-flight PUBLISHes again with DUP and their packet ids and its
    PUBREL, the away one its queue in order, the publisher's QoS 2 exchange completes, the retained message
    and the will of the crashed connection are there; once all is acknowledged nothing is left."""
    write_version_2(tmp_path / "broker.db")
    pair = BrokerPair(tmp_path)
    busy = come_back(pair, "busy", level=pk.MQTT_311)
    resent = busy.received()
    assert [(type(p).__name__, p.packet_id, getattr(p, "dup", None)) for p in resent] == [
        ("Publish", 2, True), ("Publish", 3, True), ("Publish", 4, True), ("PubRel", 5, None)]
    assert [p.payload for p in resent if isinstance(p, pk.Publish)] == [b"shared 1", b"shared 2", b"expires in a day"]
    busy.send(pk.PubAck(2), pk.PubAck(3), pk.PubAck(4), pk.PubComp(5))
    assert busy.received() == []

    away = come_back(pair, "away")
    got = [p for p in away.received() if isinstance(p, pk.Publish)]
    assert [(p.topic, p.payload, p.qos, p.dup) for p in got] == [
        ("q/shared", b"shared 0", 1, False), ("q/shared", b"shared 1", 1, False), ("q/shared", b"shared 2", 1, False),
        ("q/expiring", b"expires in a day", 1, False), ("x/2", b"exactly once", 2, False)]
    assert got[0].properties[pr.CONTENT_TYPE] == "text/plain" and got[0].properties[pr.USER_PROPERTY] == [("k", "v0")]
    assert got[0].properties[pr.SUBSCRIPTION_IDENTIFIER] == [5] and 0 < got[3].properties[pr.MESSAGE_EXPIRY_INTERVAL] <= 86400
    away.send(*(pk.PubAck(p.packet_id or 0) for p in got[:4]), pk.PubRec(got[4].packet_id or 0))
    assert away.expect(pk.PubRel).packet_id == got[4].packet_id
    away.send(pk.PubComp(got[4].packet_id or 0))

    publisher = come_back(pair, "publisher")
    publisher.send(pk.PubRel(11))
    assert publisher.expect(pk.PubComp).reason_code == 0  # the id was known: not 0x92
    watcher = pair.client()
    watcher.connect("watcher")
    watcher.send(pk.Subscribe(1, [pk.SubscribeRequest("kept/state", 0), pk.SubscribeRequest("status/busy", 0)]))
    assert {(p.topic, p.payload) for p in watcher.received() if isinstance(p, pk.Publish)} == {
        ("kept/state", b"on"), ("status/busy", b"offline")}
    pair.stop()
    with closing(sqlite3.connect(tmp_path / "broker.db")) as db:
        assert db.execute("SELECT (SELECT count(*) FROM outbound), (SELECT count(*) FROM messages)").fetchone() == (0, 0)


@campaign(40, deadline=None)
@given(limit=st.integers(1, 5000), sizes=st.lists(st.integers(8, 1500), min_size=1, max_size=25))
def test_the_byte_bound_holds_and_exactly_the_refused_messages_get_quota_exceeded(limit: int, sizes: list[int]) -> None:
    """Whatever the sizes: the stored bytes never pass the bound, the publisher hears 0x97 for exactly the
    messages the away session did not queue, and the client gets exactly the others, in order."""
    with tempfile.TemporaryDirectory() as folder:
        pair = BrokerPair(Path(folder), max_queued_bytes=limit)
        away_subscriber(pair, "bounded")
        publisher = pair.connected("bounded-publisher")
        accepted: list[int] = []
        for index, size in enumerate(sizes):
            publisher.send(pk.Publish("q/t", f"{index:08d}".encode().ljust(size, b"."), 1, packet_id=index + 1))
            ack = publisher.expect(pk.PubAck)
            assert ack.reason_code in (0, rc.QUOTA_EXCEEDED)
            if ack.reason_code == 0:
                accepted.append(index)
            assert pair.broker.sessions["bounded"].stored_bytes <= limit
        assert pair.broker.sessions["bounded"].dropped == len(sizes) - len(accepted)
        assert indexes(drain(come_back(pair, "bounded"))) == accepted
        pair.stop()


def test_qos0_messages_queued_in_memory_for_an_away_client_are_bounded_by_bytes(tmp_path: Path) -> None:
    """QoS 0 deliveries of an away session stay in memory (they are not worth a write), so they have a
    byte bound next to max_queued_messages: of 60 x 1 MB the first 8 MiB are kept, the rest dropped and
    counted (held with their received frames: about twice the payload, not 120 MB)."""
    pair = BrokerPair(tmp_path, max_packet_size=2 * 1024 * 1024)
    away_subscriber(pair, qos=0)
    publisher = pair.connected("publisher")
    with allocations_kept() as kept:
        for index in range(60):
            publisher.send(pk.Publish("q/t", f"{index:08d}".encode().ljust(MEGABYTE - 100, b"."), 0))
    session = pair.broker.sessions["away"]
    assert (len(session.queue), session.dropped) == (8, 52)
    assert kept.bytes < 20 * MEGABYTE, f"{kept.bytes / MEGABYTE:.1f} MB held"
    assert indexes(drain(come_back(pair))) == list(range(8))


def test_publishers_are_held_back_by_the_bytes_a_connected_client_has_queued(tmp_path: Path) -> None:
    """A connected client that does not acknowledge: its queue behind the window stops growing at about
    MEMORY_QUEUE_BYTES of payload (the publisher is held back), not at 1,000 messages."""
    pair = BrokerPair(tmp_path, max_packet_size=2 * 1024 * 1024)
    subscriber = pair.client()
    subscriber.connect("slow", properties={pr.RECEIVE_MAXIMUM: 1})
    subscriber.subscribe("q/#", 1)
    publisher = pair.connected("publisher")
    index = 0
    while "backpressure" not in publisher.holds:
        publisher.send(pk.Publish("q/t", f"{index:08d}".encode().ljust(MEGABYTE, b"."), 1, packet_id=index + 1))
        index += 1
        assert index < 20, "the publisher was never held back"
    assert pair.broker.sessions["slow"].queued_bytes <= 8 * MEGABYTE
