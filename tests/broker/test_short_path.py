"""The short path (``appliance/broker/short_path.py``) against the general path it stands in for.

Two brokers on the fake clock (``tests/broker/pair.py``), one with the short path and one without, get
the same random sequence of connects (both versions, clean or durable sessions, small windows, packet
size limits, outbound topic aliases), subscriptions (overlapping, no-local, shared, with identifiers,
retain-as-published), reads of PUBLISHes (QoS 0-2, retained, with properties, cut across reads, more
than a turn's budget, two clients' reads in one loop turn), acknowledgements, disconnects, congestion, ACL
reloads and the clock (a read alone in its turn is written at its end on the short path, in the turn's
flush on the general one). After every step every client must have received the same bytes from both,
and at the end the brokers' observable state (sessions, what is in flight and queued, the counters of
``$SYS`` and the metrics) must be the same.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.broker import LONE_READ_BYTES, QUIET_READ_GAP, Broker
from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec.writer import encode
from appliance.broker.security.acl import Acl
from appliance.broker.security.auth import Authenticator
from appliance.broker.short_path import ROUTE_CACHE_TOPIC_BYTES, ROUTE_CACHE_TOPICS
from testing.campaigns import campaign
from tests.broker.pair import BrokerPair, FakeClient

CLIENTS = ("a", "b", "c")
#: Where packet ids start (the one before the first): a client's, by its connection's order, and the
#: broker's for a fresh session, by the client.
FIRST_PACKET_IDS = (0, 250, 65530)
TOPICS = ("t/a", "t/b", "t/c", "x")
FILTERS = ("t/a", "t/b", "t/#", "#", "t/+", "x", "$share/g/t/a", "$share/g/t/#")
#: The ACLs a step may switch to: none, everything, and one that lets everyone publish anywhere but read
#: only ``t/a`` and ``x`` (subscriptions made before it stay, and their deliveries are checked).
ACLS: tuple[str | None, ...] = (None, "topic readwrite #\n", "topic write #\ntopic read t/a\ntopic read x\n")

CONNECT = st.tuples(
    st.just("connect"), st.integers(0, 2), st.sampled_from([pk.MQTT_311, pk.MQTT_5]), st.booleans(),
    st.sampled_from([0, 0, 60]), st.sampled_from([None, 1, 2, 20]), st.sampled_from([0, 0, 2]),
    st.sampled_from([None, None, 30, 300]),
)
SUBSCRIBE = st.tuples(
    st.just("subscribe"), st.integers(0, 2), st.sampled_from(FILTERS), st.integers(0, 2), st.booleans(),
    st.booleans(), st.sampled_from([None, None, None, 7]),
)
PUBLISH = st.tuples(
    st.sampled_from(TOPICS), st.sampled_from([0, 0, 1, 1, 2]), st.sampled_from([False, False, False, True]),
    st.sampled_from([0, 3, 3, 140]), st.sampled_from(["", "", "", "expiry", "user", "alias"]),
)
PUBLISHES = st.tuples(st.just("publish"), st.integers(0, 2), st.lists(PUBLISH, min_size=1, max_size=5),
                      st.integers(0, 2), st.sampled_from([0, 0, 0, 7, 40, 400]))
ACKS = st.tuples(st.just("ack"), st.integers(0, 2), st.integers(1, 8))
#: Every client connected and subscribed once, so that the random steps after it mostly move messages.
PROLOGUE = st.tuples(*(st.tuples(CONNECT.map(lambda step, index=index: (step[0], index, *step[2:])),
                                 SUBSCRIBE.map(lambda step, index=index: (step[0], index, *step[2:])))
                       for index in range(len(CLIENTS))))
#: (weight, step): mostly messages and acknowledgements, now and then a change under them.
WEIGHTED_STEPS: tuple[tuple[int, st.SearchStrategy[tuple[Any, ...]]], ...] = (
    (8, PUBLISHES),
    (4, ACKS),
    (1, CONNECT),
    (1, SUBSCRIBE),
    (1, st.tuples(st.just("unsubscribe"), st.integers(0, 2), st.sampled_from(FILTERS))),
    (1, st.tuples(st.just("disconnect"), st.integers(0, 2), st.booleans())),
    (1, st.tuples(st.just("congest"), st.integers(0, 2), st.booleans())),
    (2, st.tuples(st.just("acl"), st.integers(0, len(ACLS) - 1))),
    # 0.00005 s: shorter than ``broker.QUIET_READ_GAP``, so the next read still coalesces with the last.
    (1, st.tuples(st.just("advance"), st.sampled_from([0.00005, 0.5, 3.0, 100.0]))),
    # Two reads in one loop turn (two clients', or one client's twice): the first may be written at its
    # end, the second waits for the turn's flush.
    (2, st.tuples(st.just("together"), st.integers(0, 2), st.integers(0, 2), st.lists(PUBLISH, min_size=1, max_size=3),
                  st.integers(0, 2))),
    (1, st.tuples(st.just("flood"), st.integers(0, 2), st.sampled_from([0, 1]))),
)
# One branch per unit of weight (``one_of`` picks a branch uniformly; each ``map`` is a branch of its own).
STEPS = st.one_of(*(strategy.map(tuple) for weight, strategy in WEIGHTED_STEPS for _ in range(weight)))
GARBAGE = st.tuples(st.just("garbage"), st.integers(0, 2))


class Side:
    """One broker of the two and its clients; ``step`` does the same thing to either."""

    def __init__(self, data_dir: Path | None, short: bool) -> None:
        self.pair = BrokerPair(data_dir)
        if not short:
            self.pair.broker.short_path = None
        self.clients: list[FakeClient] = []  # every connection ever opened, in order
        self.current: dict[int, FakeClient] = {}
        self.owed: dict[FakeClient, list[pk.Packet]] = {}
        self.packet_ids: dict[FakeClient, int] = {}

    @property
    def broker(self) -> Broker:
        return self.pair.broker

    def step(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "acl":
            text = ACLS[step[1]]
            self.broker.reload_security(Authenticator(None, True), Acl.parse(text) if text is not None else None)
            self.pair.runtime.run()
            return
        if kind == "advance":
            self.pair.advance(step[1])
            return
        index = step[1]
        if kind == "connect":
            _, _, level, clean, expiry, receive_maximum, alias_maximum, packet_maximum = step
            client = self.pair.client(level)
            self.clients.append(client)
            self.current[index] = client
            properties: dict[int, Any] = {}
            if level == pk.MQTT_5:
                if expiry:
                    properties[pr.SESSION_EXPIRY_INTERVAL] = expiry
                if receive_maximum is not None:
                    properties[pr.RECEIVE_MAXIMUM] = receive_maximum
                if alias_maximum:
                    properties[pr.TOPIC_ALIAS_MAXIMUM] = alias_maximum
                if packet_maximum is not None:
                    properties[pr.MAXIMUM_PACKET_SIZE] = packet_maximum
            client.send(pk.Connect(level, CLIENTS[index], clean, 0,
                                   properties=properties))
            session = self.broker.sessions.get(CLIENTS[index])
            if session is not None and session._next_packet_id == 1 and not session.inflight:
                # The broker's ids too (what the subscribers acknowledge) cross a high byte and the wrap.
                session._next_packet_id = FIRST_PACKET_IDS[index] + 1
            return
        client = self.current.get(index)
        if client is None or client.closed:
            return
        v5 = client.level == pk.MQTT_5
        if kind == "subscribe":
            _, _, topic_filter, qos, no_local, as_published, identifier = step
            properties = {pr.SUBSCRIPTION_IDENTIFIER: [identifier]} if identifier is not None and v5 else {}
            request = pk.SubscribeRequest(topic_filter, qos, no_local and v5 and not topic_filter.startswith("$share"),
                                          as_published and v5)
            client.send(pk.Subscribe(self._packet_id(client), [request], properties))
        elif kind == "unsubscribe":
            client.send(pk.Unsubscribe(self._packet_id(client), [step[2]]))
        elif kind == "publish":
            _, _, publishes, ack_first, cut = step
            data = self._publishes(client, publishes, ack_first)
            if 0 < cut < len(data):
                client.send(data[:cut])
                if not client.closed:
                    client.send(data[cut:])
            else:
                client.send(data)
        elif kind == "together":
            # Two reads the loop finds ready in one turn: both were sent before the broker answered either, so
            # the second is made before the first arrives (it cannot acknowledge what the first one's
            # answer delivers, which the short path may write at once and the general path at the turn's end).
            _, _, other_index, publishes, ack_first = step
            other = self.current.get(other_index)
            first = self._publishes(client, publishes, 0)
            second = self._publishes(other, publishes, ack_first) if other is not None and not other.closed else None
            client.arrive(first)
            if other is not None and second is not None and not other.closed:
                other.arrive(second)
            self.pair.runtime.run()
        elif kind == "ack":
            packets = self._acks(client, step[2])
            if packets:
                client.send(*packets)
        elif kind == "disconnect":
            if step[2]:
                client.send(pk.Disconnect())
            else:
                client.drop()
        elif kind == "congest":
            client.congest(step[2])
        elif kind == "flood":
            # More PUBLISHes in one read than a loop turn's budget (dispatch.TURN_PACKET_BUDGET).
            qos = step[2]
            client.send(*(pk.Publish("t/a", b"f", qos, packet_id=self._packet_id(client) if qos else None)
                          for _ in range(140)))
        elif kind == "garbage":
            client.send(encode(pk.Publish("t/a", b"ok", 0), client.level) + b"\x30\xff\xff\xff\xff\x01")

    def _publishes(self, client: FakeClient, publishes: list[tuple[Any, ...]], ack_first: int) -> bytes:
        """One read: up to ``ack_first`` owed replies, then ``publishes`` (topic, QoS, retain, payload
        size, extra)."""
        v5 = client.level == pk.MQTT_5
        packets: list[pk.Packet] = self._acks(client, ack_first)
        for topic, qos, retain, size, extra in publishes:
            properties: dict[int, Any] = {}
            if v5 and extra == "expiry":
                properties[pr.MESSAGE_EXPIRY_INTERVAL] = 50
            elif v5 and extra == "user":
                properties[pr.USER_PROPERTY] = [("k", "v")]
            elif v5 and extra == "alias":
                properties[pr.TOPIC_ALIAS] = 1
            packet_id = self._packet_id(client) if qos else None
            packets.append(pk.Publish(topic, bytes(range(size % 256)) * (size // 256 + 1) if size else b"", qos,
                                      retain, False, packet_id, properties))
        return b"".join(encode(packet, client.level) for packet in packets)

    def _packet_id(self, client: FakeClient) -> int:
        # Connections start their ids at 1, 251 and 65531 in turn, so that ids with a high byte and the wrap
        # after 65535 go through the short path's framing too.
        packet_id = self.packet_ids.get(client, FIRST_PACKET_IDS[self.clients.index(client) % 3]) % 65535 + 1
        self.packet_ids[client] = packet_id
        return packet_id

    def _acks(self, client: FakeClient, count: int) -> list[pk.Packet]:
        """The replies ``client`` owes for what it received (PUBACK, PUBREC, PUBREL, PUBCOMP), up to ``count``."""
        owed = self.owed.setdefault(client, [])
        for packet in client.received():
            if isinstance(packet, pk.Publish) and packet.qos == 1:
                owed.append(pk.PubAck(packet.packet_id or 0))
            elif isinstance(packet, pk.Publish) and packet.qos == 2:
                owed.append(pk.PubRec(packet.packet_id or 0))
            elif isinstance(packet, pk.PubRel):
                owed.append(pk.PubComp(packet.packet_id))
            elif isinstance(packet, pk.PubRec) and packet.reason_code < 0x80:
                owed.append(pk.PubRel(packet.packet_id))
        replies, self.owed[client] = owed[:count], owed[count:]
        return replies

    def wire(self) -> list[tuple[bytes, bool]]:
        return [(bytes(client.raw), client.closed) for client in self.clients]

    def state(self) -> dict[str, Any]:
        broker = self.broker
        stats = broker.stats
        sessions = {
            client_id: (
                session.expiry_interval, session.connection is not None, session.dropped, session.completed,
                session.queued_bytes, session.spilled, session.stored_bytes,
                [(packet_id, d.qos, d.message.topic, d.message.payload, d.sent, d.released)
                 for packet_id, d in session.inflight.items()],
                [(d.qos, d.message.topic, d.message.payload) for d in session.queue],
            )
            for client_id, session in broker.sessions.items()
        }
        return {
            "sessions": sessions,
            "stats": (stats.messages_received, stats.messages_sent, list(stats.received_by_qos), stats.bytes_received,
                      stats.bytes_sent, stats.retained_count),
            "router": (list(broker.router.sent_by_qos), broker.router.queue_full),
            "holds": [sorted(client.holds) for client in self.clients],
        }


@contextmanager
def two_brokers(durable_store: bool) -> Iterator[tuple[Side, Side]]:
    with tempfile.TemporaryDirectory(prefix="short-path-") as tmp:
        short_dir = Path(tmp) / "short" if durable_store else None
        general_dir = Path(tmp) / "general" if durable_store else None
        for directory in (short_dir, general_dir):
            if directory is not None:
                directory.mkdir()
        short, general = Side(short_dir, True), Side(general_dir, False)
        try:
            yield short, general
        finally:
            short.pair.stop()
            general.pair.stop()


@campaign(250, deadline=None)
@given(prologue=PROLOGUE, steps=st.lists(STEPS, min_size=5, max_size=40), ending=st.lists(GARBAGE, max_size=1),
       durable_store=st.booleans())
def test_the_short_path_is_the_general_path(prologue: tuple[tuple[tuple[Any, ...], ...], ...],
                                            steps: list[tuple[Any, ...]], ending: list[tuple[Any, ...]],
                                            durable_store: bool) -> None:
    with two_brokers(durable_store) as (short, general):
        for number, step in enumerate([step for pair in prologue for step in pair] + steps + ending):
            short.step(step)
            general.step(step)
            assert short.wire() == general.wire(), f"the bytes differ after step {number}: {step}"
        assert short.state() == general.state()


def common_publishes(short: Side, general: Side) -> None:
    """A QoS 1 subscriber and a publisher on both sides, with messages that go the short path."""
    for side in (short, general):
        side.step(("connect", 0, pk.MQTT_5, True, 0, 10, 0, None))
        side.step(("subscribe", 0, "t/#", 1, False, False, None))
        side.step(("connect", 1, pk.MQTT_5, True, 0, None, 0, None))
        side.step(("publish", 1, [("t/a", 1, False, 3, ""), ("t/b", 0, False, 3, "")], 0, 0))


def test_common_publishes_take_the_short_path() -> None:
    """The differential test above compares something: the common messages do go the short path."""
    with two_brokers(False) as (short, general):
        common_publishes(short, general)
        assert short.wire() == general.wire()
        routes = short.broker.short_path.routes  # type: ignore[union-attr]
        assert {entry.topic for entry in routes.values()} == {"t/a", "t/b"}
        sessions = short.broker.sessions
        assert [d.message.topic for d in sessions["a"].inflight.values()] == ["t/a"]


def test_an_acl_reload_applies_to_cached_routes() -> None:
    """The planted-bug check of the brief as a fixed case: a route cached while everything may be read,
    then an ACL that lets nobody read ``t/b``: the subscriber does not get it, on either path."""
    with two_brokers(False) as (short, general):
        common_publishes(short, general)
        for side in (short, general):
            side.step(("acl", 2))
            side.step(("publish", 1, [("t/b", 0, False, 3, ""), ("t/a", 0, False, 3, "")], 0, 0))
        assert short.wire() == general.wire()
        subscriber = short.clients[0]
        topics = [packet.topic for packet in subscriber.received() if isinstance(packet, pk.Publish)]
        assert topics == ["t/a", "t/b", "t/a"]


@pytest.mark.parametrize("level", [pk.MQTT_311, pk.MQTT_5], ids=["mqtt311", "mqtt5"])
def test_the_route_cache_is_bounded(level: int) -> None:
    """A client publishing to ever new topics cannot grow the route cache past ``ROUTE_CACHE_TOPICS``."""
    pair = BrokerPair(None)
    publisher = pair.connected("p", level)
    routes = pair.broker.short_path.routes  # type: ignore[union-attr]
    burst = 100
    for start in range(0, ROUTE_CACHE_TOPICS + 2 * burst, burst):
        publisher.send(*(pk.Publish(f"r/{index}", b"", 0) for index in range(start, start + burst)))
        assert len(routes) <= ROUTE_CACHE_TOPICS
    long_topic = "r/" + "x" * ROUTE_CACHE_TOPIC_BYTES
    publisher.send(pk.Publish(long_topic, b"", 0))
    assert all(len(key) <= ROUTE_CACHE_TOPIC_BYTES for key in routes)
    assert not publisher.closed


def test_no_cached_route_outlives_a_subscription_change() -> None:
    """An ended session's subscriptions leave the tree (its generation moves): the next miss empties the
    route cache, so no entry keeps the ended session alive."""
    pair = BrokerPair(None)
    subscriber = pair.connected("s")
    subscriber.subscribe("t/#", 1)
    publisher = pair.connected("p")
    publisher.send(pk.Publish("t/a", b"1", 1, packet_id=1))
    routes = pair.broker.short_path.routes  # type: ignore[union-attr]
    ended = pair.broker.sessions["s"]
    assert [target[0] for entry in routes.values() for target in entry.targets or ()] == [ended]
    subscriber.send(pk.Disconnect())
    publisher.send(pk.Publish("u", b"2", 0))
    assert "s" not in pair.broker.sessions
    assert all(target[0] is not ended for entry in routes.values() for target in entry.targets or ())


@pytest.mark.parametrize("level", [pk.MQTT_311, pk.MQTT_5], ids=["mqtt311", "mqtt5"])
def test_a_read_cut_anywhere(level: int) -> None:
    """Two PUBLISHes (one with a two-byte remaining length) and a PUBACK, cut into two reads at every
    byte: both paths frame the same packets."""
    for cut in range(1, 170):
        with two_brokers(False) as (short, general):
            for side in (short, general):
                side.step(("connect", 0, level, True, 0, None, 0, None))
                side.step(("subscribe", 0, "t/#", 1, False, False, None))
                side.step(("connect", 1, level, True, 0, None, 0, None))
                side.step(("publish", 1, [("t/a", 1, False, 140, ""), ("t/b", 0, False, 3, "")], 0, cut))
                side.step(("publish", 0, [("t/c", 1, False, 3, "")], 1, cut % 9))
            assert short.wire() == general.wire(), f"cut at {cut}"
            assert short.state() == general.state(), f"cut at {cut}"


def test_a_read_alone_in_its_turn_is_written_at_its_end() -> None:
    """At a low rate a small read the short path takes whole is written before the loop runs anything else
    (no ``call_soon`` turn); a read within ``QUIET_READ_GAP`` of it, or a larger one, waits for the turn's
    flush, so the reads of a busy turn are still written once per connection."""
    pair = BrokerPair(None)
    subscriber = pair.connected("s")
    subscriber.subscribe("t/#", 1)
    first, second = pair.connected("p1"), pair.connected("p2")
    pair.advance(1.0)
    before = [client.writes for client in (subscriber, first, second)]
    reads = pair.count_clock_reads()
    first.arrive(pk.Publish("t/a", b"1", 1, packet_id=1))
    assert reads == {"now": 1, "monotonic": 1}  # one read, one reading of the clock, written at once or not
    assert [type(packet) for packet in subscriber.received()] == [pk.Publish]
    assert [type(packet) for packet in first.received()] == [pk.PubAck]
    second.arrive(pk.Publish("t/b", b"2", 1, packet_id=1))
    first.arrive(pk.Publish("t/c", b"3", 0))
    assert subscriber.received() == [] and second.received() == []
    pair.runtime.run()
    assert [packet.topic for packet in subscriber.received() if isinstance(packet, pk.Publish)] == ["t/b", "t/c"]
    assert [type(packet) for packet in second.received()] == [pk.PubAck]
    assert [client.writes - count for client, count in zip((subscriber, first, second), before, strict=True)] == [2, 1, 1]
    pair.advance(2 * QUIET_READ_GAP)
    second.arrive(pk.Publish("t/d", b"4", 0))
    assert [packet.topic for packet in subscriber.received() if isinstance(packet, pk.Publish)] == ["t/d"]
    pair.advance(1.0)
    second.arrive(pk.Publish("t/e", bytes(LONE_READ_BYTES), 0))
    assert subscriber.received() == []
    pair.runtime.run()
    assert [packet.topic for packet in subscriber.received() if isinstance(packet, pk.Publish)] == ["t/e"]
