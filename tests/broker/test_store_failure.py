"""A ``broker.db`` that cannot commit (issue 12 item 8): the broker keeps serving what needs no write,
answers what does with a failure instead of freezing, logs the condition once, shows it in ``$SYS`` and
Prometheus, and recovers on its own. On the fake clock (``tests/broker/pair.py``) with a real SQLite
file that really refuses the commit: another connection holds its write lock (SQLITE_BUSY: 0x80), or
SQLite's own size limit is reached (``PRAGMA max_page_count``: SQLITE_FULL, as a full disk: 0x97). The
real full filesystem is ``tests/broker/test_full_disk.py``."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.writer import encode
from appliance.broker.persistence.store_failure import HeldAck
from appliance.prometheus import render
from appliance.store_health import LOG_INTERVAL
from testing.campaigns import campaign
from tests.broker.pair import BrokerPair, FakeClient
from tests.broker.test_hardening import LockedStore
from tests.broker.test_timing import LEVELS, durable, publishes


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[BrokerPair]:
    pair = BrokerPair(tmp_path, max_session_expiry=600)
    yield pair
    pair.stop()


def acks(client: FakeClient) -> list[tuple[int, int]]:
    return [(p.packet_id, p.reason_code) for p in client.received() if isinstance(p, pk.PubAck)]


def away_subscriber(pair: BrokerPair, level: int, client_id: str = "away") -> None:
    """A durable session subscribed to ``stored/#`` at QoS 1 whose client is away: every QoS 1 message
    there must be stored before its publisher may be acknowledged."""
    client = pair.client(level)
    client.connect(client_id, **durable(level, expiry=600))  # type: ignore[arg-type]
    client.subscribe("stored/#", 1)
    client.drop()


def store_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("appliance") and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("level", LEVELS)
def test_a_failing_store_serves_what_needs_no_write_refuses_the_rest_and_recovers(
    pair: BrokerPair, tmp_path: Path, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    v5 = level == pk.MQTT_5
    listener = pair.client(level)
    listener.connect("listener")
    listener.subscribe("live/#", 1)
    away_subscriber(pair, level)
    locked = LockedStore(pair, tmp_path / "broker.db")

    # The turn whose commit fails: the PUBACK is answered as a failure (3.1.1: closed, none at all).
    first = pair.client(level)
    first.connect("first")
    first.send(pk.Publish("stored/kept", b"kept", qos=1, packet_id=1))
    assert acks(first) == ([(1, rc.UNSPECIFIED_ERROR)] if v5 else [])
    assert first.closed is not v5
    assert pair.broker.store_failing

    # While it fails, for minutes of traffic: everything that needs no write is served as usual ...
    for _ in range(20):
        pair.advance(3.0)
        client = pair.client(level)
        assert client.connect(f"clean-{pair.runtime.time}").reason_code == 0
        client.send(pk.PingReq())
        assert isinstance(client.expect(pk.PingResp), pk.PingResp)
        assert client.subscribe("more/#", 1).reason_codes == [1]
        client.send(pk.Publish("live/q0", b"zero", qos=0), pk.Publish("live/q1", b"one", qos=1, packet_id=5))
        assert acks(client) == [(5, 0)]
        assert [m.payload for m in publishes(listener.received())] == [b"zero", b"one"]
        # ... and what needs one is refused before it changes anything.
        client.send(pk.Publish("stored/refused", b"refused", qos=1, packet_id=6))
        assert acks(client) == ([(6, rc.UNSPECIFIED_ERROR)] if v5 else [])
        assert client.closed is not v5
        assert publishes(listener.received()) == []
        refused = pair.client(level)
        connack = refused.connect(f"durable-{pair.runtime.time}", **durable(level))  # type: ignore[arg-type]
        assert connack.reason_code == (rc.UNSPECIFIED_ERROR if v5 else rc.SERVER_UNAVAILABLE) and refused.closed
        client.drop()

    # Logged once, not once per attempt.
    [failing] = store_logs(caplog)
    assert failing.levelno == logging.ERROR and "broker.db" in failing.getMessage()

    # Room again: the next retry commits, within a second, without any client's help.
    locked.release()
    pair.advance(1.0)
    assert not pair.broker.store_failing
    [_, recovered] = store_logs(caplog)
    assert recovered.levelno == logging.WARNING and "succeed again" in recovered.getMessage()
    publisher = pair.client(level)
    publisher.connect("after")
    publisher.send(pk.Publish("stored/after", b"after", qos=1, packet_id=9))
    assert acks(publisher) == [(9, 0)]
    back = pair.client(level)
    back.send(pk.Connect(level, "away", **durable(level, expiry=600)))  # type: ignore[arg-type]
    # What the failing turn changed was kept and committed later (at least once); the refused one never was.
    assert [m.payload for m in publishes(back.received())] == [b"kept", b"after"]


@pytest.mark.parametrize("level", LEVELS)
def test_only_the_acknowledgements_that_wait_on_the_failed_commit_are_answered_as_failures(
    pair: BrokerPair, tmp_path: Path, level: int
) -> None:
    away_subscriber(pair, level)
    publisher = pair.client(level)
    publisher.connect("publisher")
    locked = LockedStore(pair, tmp_path / "broker.db")  # held to the end: see LockedStore
    publisher.send(
        pk.Publish("live/a", b"a", qos=1, packet_id=1),
        pk.Publish("stored/b", b"b", qos=1, packet_id=2),
        pk.Publish("live/c", b"c", qos=1, packet_id=3),
        pk.PingReq(),
    )
    received = publisher.received()
    if level == pk.MQTT_5:  # in order, each for what it is
        assert [(p.packet_id, p.reason_code) for p in received if isinstance(p, pk.PubAck)] == [
            (1, 0), (2, rc.UNSPECIFIED_ERROR), (3, 0)]
        assert isinstance(received[-1], pk.PingResp) and not publisher.closed
    else:  # what came before the one that cannot be acknowledged, then the connection ends
        assert [(p.packet_id, p.reason_code) for p in received if isinstance(p, pk.PubAck)] == [(1, 0)]
        assert publisher.closed
    locked.release()


@pytest.mark.parametrize("level", LEVELS)
def test_durable_subscriptions_and_qos2_exchanges_wait_for_the_store(pair: BrokerPair, tmp_path: Path, level: int) -> None:
    client = pair.client(level)
    client.connect("durable", **durable(level))  # type: ignore[arg-type]
    client.send(pk.Publish("q2/x", b"x", qos=2, packet_id=4))
    assert isinstance(client.expect(pk.PubRec), pk.PubRec)
    locked = LockedStore(pair, tmp_path / "broker.db")
    trigger = pair.client(level)  # its session is the first thing that cannot be committed
    connack = trigger.connect("trigger", **durable(level))  # type: ignore[arg-type]
    assert connack.reason_code == (rc.UNSPECIFIED_ERROR if level == pk.MQTT_5 else rc.SERVER_UNAVAILABLE)
    assert trigger.closed and pair.broker.store_failing
    # SUBACK says failure (3.1.1 has 0x80 too): the subscription would have to be stored.
    suback = client.subscribe("new/#", 1, packet_id=2)
    assert suback.reason_codes == [rc.UNSPECIFIED_ERROR]
    # PUBCOMP would drop the stored packet id, and has no failure code: the connection ends instead.
    client.send(pk.PubRel(4))
    assert client.closed and not [p for p in client.received() if isinstance(p, pk.PubComp)]
    locked.release()
    pair.advance(1.0)
    again = pair.client(level)
    assert again.connect("durable", **durable(level)).session_present  # type: ignore[arg-type]
    again.send(pk.PubRel(4))
    assert again.expect(pk.PubComp).reason_code == 0


def test_a_full_database_answers_quota_exceeded(tmp_path: Path) -> None:
    """SQLITE_FULL (here SQLite's own size limit, as a full disk) is 0x97 Quota exceeded."""
    pair = BrokerPair(tmp_path, max_session_expiry=600)
    try:
        away_subscriber(pair, pk.MQTT_5)
        assert pair.store is not None
        pages = pair.store._db.execute("PRAGMA page_count").fetchone()[0]
        pair.store._db.execute(f"PRAGMA max_page_count = {pages}")
        publisher = pair.client(pk.MQTT_5)
        publisher.connect("publisher")
        publisher.send(pk.Publish("stored/big", b"x" * 100_000, qos=1, packet_id=1))
        assert acks(publisher) == [(1, rc.QUOTA_EXCEEDED)]
        publisher.send(pk.Publish("stored/more", b"y", qos=1, packet_id=2))
        assert acks(publisher) == [(2, rc.QUOTA_EXCEEDED)]
        assert pair.broker.store_health.disk_full
        pair.store._db.execute("PRAGMA max_page_count = 1073741823")
        pair.advance(1.0)
        publisher.send(pk.Publish("stored/more", b"y", qos=1, packet_id=3))
        assert acks(publisher) == [(3, 0)]
    finally:
        pair.stop()


def test_sys_topics_and_prometheus_show_the_store_state(tmp_path: Path) -> None:
    pair = BrokerPair(tmp_path, max_session_expiry=600, sys_interval=10)
    try:
        watcher = pair.client()
        watcher.connect("watcher")
        watcher.subscribe("$SYS/broker/store/#")
        assert 'appliance_store_healthy{store="broker"} 1' in render(pair.broker.metrics())

        def state() -> dict[str, bytes]:
            return {m.topic.removeprefix("$SYS/broker/store/"): m.payload for m in publishes(watcher.received())}

        pair.advance(10.0)
        assert state()["healthy"] == b"1"
        away_subscriber(pair, pk.MQTT_5)
        locked = LockedStore(pair, tmp_path / "broker.db")
        publisher = pair.client()
        publisher.connect("publisher")
        publisher.send(pk.Publish("stored/x", b"x", qos=1, packet_id=1))
        pair.advance(1.0)  # the change is published at the next tick, not at the next interval
        seen = state()
        assert seen["healthy"] == b"0" and int(seen["commits/failed"]) >= 1 and int(seen["refused"]) >= 1
        text = render(pair.broker.metrics())
        assert 'appliance_store_healthy{store="broker"} 0' in text and "# TYPE appliance_store_failed_commits_total counter" in text
        locked.release()
        pair.advance(1.0)
        assert state()["healthy"] == b"1"
        assert 'appliance_store_healthy{store="broker"} 1' in render(pair.broker.metrics())
    finally:
        pair.stop()


def test_a_flapping_store_is_logged_at_most_once_per_interval_and_ends_with_its_state(
    pair: BrokerPair, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    away_subscriber(pair, pk.MQTT_5)
    publisher = pair.client()
    publisher.connect("publisher")
    for n in range(1, 21):  # fail, recover, fail, ... every half second for 10 s
        locked = LockedStore(pair, tmp_path / "broker.db")
        publisher.send(pk.Publish("stored/x", b"x", qos=1, packet_id=n))
        locked.release()
        pair.advance(0.5)
    assert len(store_logs(caplog)) <= 2
    pair.advance(LOG_INTERVAL)
    logs = store_logs(caplog)
    assert len(logs) <= 3 and "healthy" in logs[-1].getMessage()


# -- hostile timing: the store fails and recovers at any point -------------------------------------------

ACTIONS = st.one_of(
    st.just("lock"), st.just("unlock"), st.floats(0.05, 1.5),
    st.lists(st.tuples(st.sampled_from(["stored", "live"]), st.integers(1, 2), st.booleans()), min_size=1, max_size=4),
)


@pytest.mark.parametrize("level", LEVELS)
@campaign(25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(ACTIONS, max_size=14))
def test_whatever_fails_when_an_acknowledged_message_is_committed_and_pings_are_answered(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture, level: int, actions: list[object]
) -> None:
    """At every step: each message that got a success PUBACK/PUBREC is in ``broker.db`` (read by another
    connection, as after kill -9), every PINGREQ is answered, no internal error is logged."""
    data_dir = tmp_path_factory.mktemp("store")
    pair = BrokerPair(data_dir, max_session_expiry=600)
    try:
        away_subscriber(pair, pk.MQTT_5, "away")
        locked: LockedStore | None = None
        acknowledged: set[bytes] = set()
        publisher: FakeClient | None = None
        sent = 0
        for action in actions:
            if action == "lock" and locked is None:
                locked = LockedStore(pair, data_dir / "broker.db")
            elif action == "unlock" and locked is not None:
                locked.release()
                locked = None
            elif isinstance(action, float):
                pair.advance(action)
            elif isinstance(action, list):
                if publisher is None or publisher.closed:
                    publisher = pair.client(level)
                    publisher.connect(f"publisher-{sent}")
                packets: list[pk.Packet] = []
                bodies: dict[int, bytes] = {}
                for where, qos, then_disconnect in action:
                    sent += 1
                    bodies[sent] = b"%s-%d" % (where.encode(), sent)
                    packets.append(pk.Publish(f"{where}/x", bodies[sent], qos=qos, packet_id=sent % 60000 + 1))
                    if then_disconnect:
                        packets.append(pk.Disconnect())
                        break
                packets.append(pk.PingReq())
                publisher.send(*packets)
                received = publisher.received()
                for packet in received:
                    if isinstance(packet, (pk.PubAck, pk.PubRec)) and packet.reason_code == 0:
                        acknowledged.add(next(b for n, b in bodies.items() if n % 60000 + 1 == packet.packet_id))
                if not publisher.closed:
                    assert isinstance(received[-1], pk.PingResp), received
            with sqlite3.connect(data_dir / "broker.db") as reader:
                committed = {row[0] for row in reader.execute(
                    "SELECT coalesce(o.payload, m.payload) FROM outbound o LEFT JOIN messages m ON m.id = o.message_id")}
            reader.close()
            assert {b for b in acknowledged if b.startswith(b"stored")} <= committed
        if locked is not None:
            locked.release()
        assert not [r for r in caplog.records if "internal error" in r.getMessage() or r.exc_info]
    finally:
        pair.stop()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ack", [
    pk.PubAck(7), pk.PubAck(65535, rc.QUOTA_EXCEEDED, {0x1F: "x" * 200}), pk.PubRec(300, rc.SUCCESS),
    pk.PubComp(2), pk.Connack(True, 0, {0x21: 64, 0x27: 1 << 20}), pk.Suback(9, [0, 1, 2] * 50),
    pk.Unsuback(12, [0x11]),
], ids=lambda ack: type(ack).__name__)
def test_a_held_acknowledgement_is_read_back_from_the_buffer_by_its_offset(level: int, ack: object) -> None:
    """The broker notes only where a held acknowledgement starts; a failed commit reads its type, packet
    id and end back from the bytes (``HeldAck.at``), whatever came before it and follows it."""
    out = bytearray(encode(pk.PingResp(), level) + encode(pk.PubAck(1), level))
    start = len(out)
    out += encode(ack, level)  # type: ignore[arg-type]
    end = len(out)
    out += encode(pk.Publish("t", b"after", 1, packet_id=5), level)
    held = HeldAck.at(out, start)
    assert (held.start, held.end, held.packet_type) == (start, end, ack.type)  # type: ignore[attr-defined]
    assert held.packet_id == getattr(ack, "packet_id", 0)
