"""The sans-I/O session and connection state: QoS flows, the Receive Maximum window, DUP redelivery, the
QoS 0 bound, topic aliases and the journal calls a durable session makes. Bytes out are parsed back
with our reader, the way h11's tests pair two state machines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.reasons import MqttProtocolError
from appliance.broker.routing.message import BrokerMessage
from appliance.broker.sessions.session import NO_QUEUE, ClientConnection, Delivery, Session
from testing.campaigns import campaign

NOW = 1_000_000.0


class Journal:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int | None]] = []

    def mark_publish_sent(self, seq: int, packet_id: int) -> None:
        self.calls.append(("publish_sent", seq, packet_id))

    def mark_sent_through(self, client_id: str, seq: int) -> None:
        self.calls.append(("sent_through", seq, None))

    def mark_pubrel_sent(self, seq: int, packet_id: int) -> None:
        self.calls.append(("pubrel_sent", seq, packet_id))

    def remove_delivery(self, seq: int) -> None:
        self.calls.append(("remove", seq, None))


def connected(v5: bool = True, receive_maximum: int = 65535, alias_maximum: int = 0) -> tuple[Session, ClientConnection]:
    connection = ClientConnection(1 << 20, 10, "test")
    properties = {pr.RECEIVE_MAXIMUM: receive_maximum, pr.TOPIC_ALIAS_MAXIMUM: alias_maximum} if v5 else {}
    connection.accept_connect(pk.Connect(5 if v5 else 4, "c", properties=properties), "c", 60)
    session = Session("c", queue_limit=3)
    session.resume(connection, NOW)
    return session, connection


def sent(connection: ClientConnection) -> list[pk.Packet]:
    packets = PacketReader(protocol_level=connection.protocol_level).feed(bytes(connection.out))
    connection.out.clear()
    return packets


def delivery(payload: bytes = b"x", qos: int = 1, expires_at: float | None = None, topic: str = "t") -> Delivery:
    return Delivery(BrokerMessage(topic, payload, qos, False, {}, "origin", expires_at), qos, False, None)


def test_qos1_window_follows_receive_maximum_and_refills_on_puback() -> None:
    """MQTT 5 only: Receive Maximum is a CONNECT property."""
    session, connection = connected(receive_maximum=2)
    for index in range(4):
        session.deliver(delivery(str(index).encode()), NOW)
    first, second = sent(connection)
    assert [first.payload, second.payload] == [b"0", b"1"]
    assert len(session.queue) == 2
    assert session.on_puback(first.packet_id, NOW) is not None
    (third,) = sent(connection)
    assert third.payload == b"2"
    assert session.on_puback(first.packet_id, NOW) is None  # already done: ignored


def test_sessions_share_no_queue_until_one_queues_and_then_it_has_its_own() -> None:
    """NO_QUEUE spares idle sessions a deque each; it must never hold a delivery (issue 30)."""
    windowed, _ = connected(receive_maximum=1)
    away = Session("away", queue_limit=3)
    bystander, _ = connected()
    assert windowed.queue is NO_QUEUE and away.queue is NO_QUEUE and bystander.queue is NO_QUEUE
    windowed.deliver(delivery(b"1"), NOW)  # in flight
    windowed.deliver(delivery(b"2"), NOW)  # behind the window of one
    away.deliver(delivery(b"3"), NOW)  # no connection
    away.deliver(delivery(b"4", qos=0), NOW)
    assert [d.message.payload for d in windowed.queue] == [b"2"]
    assert [d.message.payload for d in away.queue] == [b"3", b"4"]
    assert len(NO_QUEUE) == 0 and bystander.queue is NO_QUEUE
    with pytest.raises(AssertionError):
        NO_QUEUE.append(delivery())
    away.clear()
    assert len(away.queue) == 0 and len(NO_QUEUE) == 0


def test_packet_ids_skip_ids_still_in_flight(level: int) -> None:
    session, connection = connected(v5=level == pk.MQTT_5)
    session.deliver(delivery(), NOW)
    (first,) = sent(connection)
    for _ in range(65534):
        session.deliver(delivery(), NOW)
        (packet,) = sent(connection)
        session.on_puback(packet.packet_id, NOW)
    session.deliver(delivery(), NOW)
    (wrapped,) = sent(connection)
    assert wrapped.packet_id != first.packet_id


def test_reconnect_resends_publish_with_dup_and_pubrel_for_released_qos2(level: int) -> None:
    session, connection = connected(v5=level == pk.MQTT_5)
    session.deliver(delivery(b"one", qos=1), NOW)
    session.deliver(delivery(b"two", qos=2), NOW)
    one, two = sent(connection)
    session.on_pubrec(two.packet_id, 0, NOW)
    assert sent(connection) == [pk.PubRel(two.packet_id)]
    session.detach(NOW)
    session.deliver(delivery(b"three", qos=1), NOW)  # queued while away
    fresh = ClientConnection(1 << 20, 10, "again")
    fresh.accept_connect(pk.Connect(level, "c"), "c", 60)
    session.resume(fresh, NOW)
    again_one, pubrel, three = sent(fresh)
    assert (again_one.dup, again_one.packet_id, again_one.payload) == (True, one.packet_id, b"one")
    assert pubrel == pk.PubRel(two.packet_id)
    assert (three.dup, three.payload) == (False, b"three")
    assert session.on_pubcomp(two.packet_id, NOW) is not None


def test_qos0_is_dropped_and_counted_past_the_queue_bound_or_when_overloaded(level: int) -> None:
    session, connection = connected(v5=level == pk.MQTT_5)
    session.detach(NOW)
    results = [session.deliver(delivery(qos=0), NOW) for _ in range(5)]
    assert results == [True, True, True, False, False]
    assert session.dropped == 2
    session.resume(connection, NOW)
    assert len(sent(connection)) == 3
    connection.congested = True  # briefly congested: the broker holds publishers back, nothing is lost
    assert session.deliver(delivery(qos=0), NOW)
    connection.overloaded = True  # congested past the grace period: a slow consumer
    assert not session.deliver(delivery(qos=0), NOW)
    assert session.deliver(delivery(qos=1), NOW)  # QoS 1 only past the queue bound (next test)
    assert session.dropped == 3
    assert len(sent(connection)) == 2


def test_qos1_for_an_away_client_is_bounded_while_a_connected_one_is_never_cut() -> None:
    """MQTT 5 here for its Receive Maximum of 1 (a window of one); the bound itself knows no version."""
    session, connection = connected(receive_maximum=1)
    for index in range(6):  # connected: one in flight, five queued past the bound of 3, none dropped
        assert session.deliver(delivery(str(index).encode()), NOW)
    assert session.dropped == 0
    assert len(sent(connection)) == 1
    session.detach(NOW)
    assert not session.deliver(delivery(b"away"), NOW)  # away with 5 queued: over the bound
    session.clear()
    results = [session.deliver(delivery(str(index).encode(), qos=1 + index % 2), NOW) for index in range(5)]
    assert results == [True, True, True, False, False]
    assert session.deliver(delivery(qos=0), NOW)  # QoS 0 has its own bound
    assert session.dropped == 3
    session.resume(connection, NOW)
    assert [p.payload for p in sent(connection) if isinstance(p, pk.Publish)] == [b"0"]


def test_qos1_for_an_overloaded_client_is_bounded_like_for_an_away_one() -> None:
    """MQTT 5 here for its Receive Maximum of 1 (a window of one); the bound itself knows no version."""
    session, connection = connected(receive_maximum=1)
    for index in range(4):  # one in flight, three queued: at the bound
        assert session.deliver(delivery(str(index).encode()), NOW)
    connection.overloaded = True  # it stopped acknowledging; its publishers run free again
    assert not session.deliver(delivery(b"more"), NOW)
    assert session.dropped == 1
    connection.overloaded = False  # it acknowledged again: lossless backpressure once more
    assert session.deliver(delivery(b"more"), NOW)


def test_expired_messages_are_not_sent_and_expiry_counts_down() -> None:
    """MQTT 5 only: the Message Expiry Interval is a PUBLISH property."""
    session, connection = connected()
    session.detach(NOW)
    session.deliver(delivery(b"old", expires_at=NOW + 5), NOW)
    session.deliver(delivery(b"new", expires_at=NOW + 100), NOW)
    expired = session.resume(connection, NOW + 10)
    assert [d.message.payload for d in expired] == [b"old"]
    (packet,) = sent(connection)
    assert packet.payload == b"new"
    assert packet.properties[pr.MESSAGE_EXPIRY_INTERVAL] == 90


def test_journal_records_progress_of_stored_deliveries(level: int) -> None:
    session, connection = connected(v5=level == pk.MQTT_5)
    journal = Journal()
    session.journal = journal
    stored = delivery(qos=2)
    stored.seq = 41
    session.detach(NOW)
    session.deliver(stored, NOW)
    session.resume(connection, NOW)
    (publish,) = sent(connection)
    session.on_pubrec(publish.packet_id, 0, NOW)
    session.on_pubcomp(publish.packet_id, NOW)
    assert publish.packet_id == 42  # its sequence number's (``stored_packet_id``): recorded per session
    assert journal.calls == [("sent_through", 41, None), ("pubrel_sent", 41, 42), ("remove", 41, None)]


def test_a_stored_delivery_whose_sequence_numbers_packet_id_is_in_flight_gets_another_recorded_with_it() -> None:
    """Two stored deliveries 65,535 sequence numbers apart would share a packet id: the second takes the
    next free one, and the store gets that packet id for its row (not the session's sent-through mark)."""
    session, connection = connected(receive_maximum=10)
    journal = Journal()
    session.journal = journal
    first, second = delivery(b"1"), delivery(b"2")
    first.seq, second.seq = 41, 41 + 65535
    session.detach(NOW)
    session.deliver(first, NOW)
    session.deliver(second, NOW)
    session.resume(connection, NOW)
    ids = [packet.packet_id for packet in sent(connection)]
    assert ids[0] == 42 and ids[1] not in (0, 42)
    assert journal.calls == [("sent_through", 41, None), ("publish_sent", 41 + 65535, ids[1])]


def test_restored_deliveries_that_share_a_packet_id_are_both_kept() -> None:
    """A damaged file could give two deliveries in flight one packet id: the second is queued (sent again
    with a packet id of its own), not put in the first one's place."""
    session, connection = connected()
    first, second = delivery(b"1"), delivery(b"2")
    for index, restored in enumerate((first, second), start=1):
        restored.seq, restored.packet_id, restored.sent = index, 7, True
        session.restore(restored)
    assert session.inflight == {7: first} and list(session.queue) == [second]


def test_pubrec_with_failure_ends_the_qos2_exchange() -> None:
    """MQTT 5 only: 3.1.1's PUBREC has no reason code."""
    session, connection = connected()
    session.deliver(delivery(qos=2), NOW)
    (publish,) = sent(connection)
    assert session.on_pubrec(publish.packet_id, rc.QUOTA_EXCEEDED, NOW) is not None
    assert sent(connection) == []
    assert not session.inflight


def test_pubrec_for_unknown_id_answers_pubrel_not_found(level: int) -> None:
    """MQTT 5 says 0x92; 3.1.1, without reason codes, gets a plain PUBREL."""
    session, connection = connected(v5=level == pk.MQTT_5)
    session.on_pubrec(77, 0, NOW)
    reason = rc.PACKET_IDENTIFIER_NOT_FOUND if level == pk.MQTT_5 else 0
    assert sent(connection) == [pk.PubRel(77, reason)]


def test_outbound_topic_alias_is_set_once_then_used() -> None:
    """MQTT 5 only: topic aliases are a PUBLISH property."""
    session, connection = connected(alias_maximum=1)
    session.deliver(delivery(qos=0, topic="long/topic"), NOW)
    session.deliver(delivery(qos=0, topic="long/topic"), NOW)
    first, second = sent(connection)
    assert (first.topic, first.properties[pr.TOPIC_ALIAS]) == ("long/topic", 1)
    assert (second.topic, second.properties[pr.TOPIC_ALIAS]) == ("", 1)


def test_outbound_topic_aliases_are_replaced_least_recently_used_first() -> None:
    """MQTT 5 only: topic aliases are a PUBLISH property."""
    session, connection = connected(alias_maximum=2)
    for topic in ("a", "b", "a", "c", "b", "a", "c"):
        session.deliver(delivery(qos=0, topic=topic), NOW)
    wire = [(p.topic, p.properties[pr.TOPIC_ALIAS]) for p in sent(connection)]
    # "c" takes over "b"'s alias (used longest ago); "b" comes back on "a"'s; "a" on "c"'s; and so on.
    assert wire == [("a", 1), ("b", 2), ("", 1), ("c", 2), ("b", 1), ("a", 2), ("c", 1)]


def test_inbound_topic_alias_resolution_and_errors() -> None:
    """MQTT 5 only: topic aliases are a PUBLISH property."""
    _, connection = connected()
    publish = pk.Publish("a/b", b"", properties={pr.TOPIC_ALIAS: 2})
    connection.resolve_topic(publish)
    assert publish.properties == {}
    aliased = pk.Publish("", b"", properties={pr.TOPIC_ALIAS: 2})
    connection.resolve_topic(aliased)
    assert aliased.topic == "a/b"
    with pytest.raises(MqttProtocolError) as too_big:
        connection.resolve_topic(pk.Publish("x", b"", properties={pr.TOPIC_ALIAS: 11}))
    assert too_big.value.reason_code == rc.TOPIC_ALIAS_INVALID
    with pytest.raises(MqttProtocolError) as unknown:
        connection.resolve_topic(pk.Publish("", b"", properties={pr.TOPIC_ALIAS: 3}))
    assert unknown.value.reason_code == rc.PROTOCOL_ERROR
    with pytest.raises(MqttProtocolError) as empty:  # wildcards in a topic name are the reader's to reject
        connection.resolve_topic(pk.Publish("", b""))
    assert empty.value.reason_code == rc.TOPIC_NAME_INVALID


def test_packets_larger_than_the_clients_maximum_are_not_sent() -> None:
    """MQTT 5 only: the client's Maximum Packet Size is a CONNECT property."""
    connection = ClientConnection(1 << 20, 10, "small")
    connection.accept_connect(pk.Connect(5, "c", properties={pr.MAXIMUM_PACKET_SIZE: 100}), "c", 60)
    session = Session("c", queue_limit=10)
    session.resume(connection, NOW)
    session.deliver(delivery(b"x" * 200), NOW)
    session.deliver(delivery(b"small"), NOW)
    (packet,) = sent(connection)
    assert packet.payload == b"small"
    assert session.dropped == 1 and len(session.inflight) == 1


def test_v311_deliveries_carry_no_properties() -> None:
    session, connection = connected(v5=False)
    message = BrokerMessage("t", b"x", 1, False, {pr.CONTENT_TYPE: "text/plain"}, None)
    session.deliver(Delivery(message, 1, False, [5]), NOW)
    raw = bytes(connection.out)
    assert raw == b"\x32\x06\x00\x01t\x00\x01x"


@given(st.lists(st.tuples(st.sampled_from(["deliver", "puback", "detach", "resume"]), st.integers(0, 2),
                          st.integers(0, 40)), max_size=60))
@campaign(200, deadline=None)
def test_queued_bytes_is_always_the_sum_of_the_queued_payloads(steps: list[tuple[str, int, int]]) -> None:
    """The router tests the memory bounds (QUEUE_HIGH_WATER, MEMORY_QUEUE_BYTES) only behind a non-empty
    queue, once per delivery: that is right only if an empty queue never holds bytes."""
    session, connection = connected(receive_maximum=2)
    for action, qos, size in steps:
        if action == "deliver":
            session.deliver(delivery(b"x" * size, qos=qos), NOW)
        elif action == "puback" and session.inflight:
            session.on_puback(next(iter(session.inflight)), NOW)
        elif action == "detach" and session.connection is not None:
            session.detach(NOW)
        elif action == "resume" and session.connection is None:
            connection = ClientConnection(1 << 20, 10, "test")
            connection.accept_connect(pk.Connect(5, "c", properties={pr.RECEIVE_MAXIMUM: 2}), "c", 60)
            session.resume(connection, NOW)
        assert session.queued_bytes == sum(len(queued.message.payload) for queued in session.queue)
