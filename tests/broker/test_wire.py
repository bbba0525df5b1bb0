"""Wire-level behaviour against a real gateway process, with exact packets and reason codes.

The client here is a raw socket speaking through our codec, so each test can do what a library client
would hide: not acknowledge, reuse a packet id, send garbage, or watch the DUP flag.
"""

from __future__ import annotations

import random
import time

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.writer import encode
from tests.broker.clients import RawClient, unique
from tests.support.processes import GatewayProcess


@pytest.fixture
def raw(gateway: GatewayProcess):
    clients: list[RawClient] = []

    def make(level: int = 5) -> RawClient:
        client = RawClient(gateway.port, level)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def test_connack_announces_limits_and_assigns_a_client_id(raw) -> None:
    client = raw()
    connack = client.connect("", properties={pr.RECEIVE_MAXIMUM: 5})
    assert connack.reason_code == rc.SUCCESS
    assert connack.properties[pr.ASSIGNED_CLIENT_IDENTIFIER]
    assert connack.properties[pr.RECEIVE_MAXIMUM] == 20
    assert connack.properties[pr.MAXIMUM_PACKET_SIZE] == 65536
    assert connack.properties[pr.TOPIC_ALIAS_MAXIMUM] > 0


def test_v311_empty_client_id_without_clean_session_is_refused(raw) -> None:
    client = raw(4)
    connack = client.connect("", clean_start=False)
    assert connack.reason_code == rc.CLIENT_IDENTIFIER_NOT_VALID
    client.expect_closed()


def test_enhanced_authentication_is_refused_with_bad_authentication_method(raw) -> None:
    client = raw()
    connack = client.connect(unique("auth"), properties={pr.AUTHENTICATION_METHOD: "SCRAM-SHA-1"})
    assert connack.reason_code == rc.BAD_AUTHENTICATION_METHOD
    client.expect_closed()


def test_unsupported_protocol_level_gets_return_code_1(raw) -> None:
    client = raw(4)
    client.send(b"\x10\x0c\x00\x04MQTT\x06\x02\x00\x3c\x00\x00")
    assert client.expect(pk.Connack).reason_code == rc.UNSUPPORTED_PROTOCOL_VERSION
    client.expect_closed()


def test_session_takeover_disconnects_the_old_connection_with_0x8e(raw) -> None:
    client_id = unique("takeover")
    old = raw()
    old.connect(client_id)
    new = raw()
    assert new.connect(client_id, clean_start=False).reason_code == 0
    seen = old.expect_closed()
    assert seen and isinstance(seen[-1], pk.Disconnect) and seen[-1].reason_code == rc.SESSION_TAKEN_OVER


def test_a_client_id_that_flaps_is_slowed_down(raw) -> None:
    client_id = unique("flap")
    durations = []
    for _ in range(7):
        client = raw()
        start = time.monotonic()
        client.connect(client_id, clean_start=False)
        durations.append(time.monotonic() - start)
    assert max(durations[:3]) < 0.2
    assert durations[-1] >= 0.4


def test_keep_alive_is_enforced_at_one_and_a_half_times(raw) -> None:
    client = raw()
    client.connect(unique("ka"), keep_alive=1)
    start = time.monotonic()
    seen = client.expect_closed(timeout=5)
    elapsed = time.monotonic() - start
    assert 1.4 <= elapsed <= 3.0
    assert isinstance(seen[-1], pk.Disconnect) and seen[-1].reason_code == rc.KEEP_ALIVE_TIMEOUT


def test_pings_keep_a_connection_alive(raw) -> None:
    client = raw()
    client.connect(unique("ping"), keep_alive=1)
    for _ in range(4):
        time.sleep(0.5)  # the client's own pacing: a ping every half keep-alive
        client.send(pk.PingReq())
        client.expect(pk.PingResp)


def test_unacknowledged_qos1_is_redelivered_with_dup_after_reconnect(raw) -> None:
    client_id = unique("dup")
    topic = unique("dup-topic")
    sub = raw()
    sub.connect(client_id, properties={pr.SESSION_EXPIRY_INTERVAL: 300})
    sub.subscribe(topic, 1)
    pub = raw()
    pub.connect(unique("dup-pub"))
    pub.send(pk.Publish(topic, b"payload", 1, packet_id=1))
    pub.expect(pk.PubAck)
    first = sub.expect(pk.Publish)
    assert not first.dup
    sub.close()  # no PUBACK
    again = raw()
    connack = again.connect(client_id, clean_start=False, properties={pr.SESSION_EXPIRY_INTERVAL: 300})
    assert connack.session_present
    redelivered = again.expect(pk.Publish)
    assert (redelivered.dup, redelivered.packet_id, redelivered.payload) == (True, first.packet_id, b"payload")
    again.send(pk.PubAck(redelivered.packet_id))
    again.send(pk.Disconnect())


def test_qos2_outbound_flow_resumes_with_pubrel_after_reconnect(raw) -> None:
    client_id = unique("q2out")
    topic = unique("q2out-topic")
    sub = raw()
    sub.connect(client_id, properties={pr.SESSION_EXPIRY_INTERVAL: 300})
    sub.subscribe(topic, 2)
    pub = raw()
    pub.connect(unique("q2out-pub"))
    pub.send(pk.Publish(topic, b"once", 2, packet_id=3))
    pub.expect(pk.PubRec)
    pub.send(pk.PubRel(3))
    pub.expect(pk.PubComp)
    publish = sub.expect(pk.Publish)
    sub.send(pk.PubRec(publish.packet_id))
    assert sub.expect(pk.PubRel).packet_id == publish.packet_id
    sub.close()  # no PUBCOMP
    again = raw()
    again.connect(client_id, clean_start=False, properties={pr.SESSION_EXPIRY_INTERVAL: 300})
    assert again.expect(pk.PubRel).packet_id == publish.packet_id  # not the PUBLISH again
    again.send(pk.PubComp(publish.packet_id))
    again.send(pk.PingReq())
    again.expect(pk.PingResp)


def test_inbound_qos2_duplicates_are_suppressed_by_packet_id(raw) -> None:
    topic = unique("q2in")
    sub = raw()
    sub.connect(unique("q2in-sub"))
    sub.subscribe(topic, 2)
    pub = raw()
    pub.connect(unique("q2in-pub"))
    pub.send(pk.Publish(topic, b"exactly once", 2, packet_id=9))
    pub.expect(pk.PubRec)
    pub.send(pk.Publish(topic, b"exactly once", 2, dup=True, packet_id=9))
    pub.expect(pk.PubRec)
    pub.send(pk.PubRel(9))
    assert pub.expect(pk.PubComp).reason_code == 0
    pub.send(pk.PubRel(9))  # unknown now
    assert pub.expect(pk.PubComp).reason_code == rc.PACKET_IDENTIFIER_NOT_FOUND
    publish = sub.expect(pk.Publish)
    sub.send(pk.PubRec(publish.packet_id))
    sub.expect(pk.PubRel)
    sub.send(pk.PubComp(publish.packet_id))
    sub.send(pk.PingReq())
    assert isinstance(sub.recv(), pk.PingResp)  # and no second PUBLISH before it


def test_in_flight_window_is_bounded_by_the_clients_receive_maximum(raw) -> None:
    topic = unique("window")
    sub = raw()
    sub.connect(unique("window-sub"), properties={pr.RECEIVE_MAXIMUM: 2})
    sub.subscribe(topic, 1)
    pub = raw()
    pub.connect(unique("window-pub"))
    for index in range(1, 6):
        pub.send(pk.Publish(topic, str(index).encode(), 1, packet_id=index))
        pub.expect(pk.PubAck)
    first, second = sub.expect(pk.Publish), sub.expect(pk.Publish)
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0.5)
    sub.send(pk.PubAck(first.packet_id))
    third = sub.expect(pk.Publish)
    assert [first.payload, second.payload, third.payload] == [b"1", b"2", b"3"]
    sub.send(pk.PubAck(second.packet_id))
    sub.send(pk.PubAck(third.packet_id))
    assert sub.expect(pk.Publish).payload == b"4"


def test_topic_aliases_in_both_directions(raw) -> None:
    topic = unique("alias") + "/a/rather/long/topic/name"
    sub = raw()
    sub.connect(unique("alias-sub"), properties={pr.TOPIC_ALIAS_MAXIMUM: 5})
    sub.subscribe(topic, 0)
    pub = raw()
    pub.connect(unique("alias-pub"))
    pub.send(pk.Publish(topic, b"1", properties={pr.TOPIC_ALIAS: 3}))
    pub.send(pk.Publish("", b"2", properties={pr.TOPIC_ALIAS: 3}))
    first, second = sub.expect(pk.Publish), sub.expect(pk.Publish)
    assert (first.topic, first.properties[pr.TOPIC_ALIAS], first.payload) == (topic, 1, b"1")
    assert (second.topic, second.properties[pr.TOPIC_ALIAS], second.payload) == ("", 1, b"2")
    pub.send(pk.Publish("", b"3", properties={pr.TOPIC_ALIAS: 4}))  # never set
    seen = pub.expect_closed()
    assert seen[-1].reason_code == rc.PROTOCOL_ERROR


def test_topic_alias_above_the_maximum_is_invalid(raw) -> None:
    pub = raw()
    maximum = pub.connect(unique("alias-max")).properties[pr.TOPIC_ALIAS_MAXIMUM]
    pub.send(pk.Publish("t", b"x", properties={pr.TOPIC_ALIAS: maximum + 1}))
    assert pub.expect_closed()[-1].reason_code == rc.TOPIC_ALIAS_INVALID


def test_message_expiry_drops_queued_messages_and_counts_down(raw) -> None:
    client_id = unique("expiry")
    topic = unique("expiry-topic")
    sub = raw()
    sub.connect(client_id, properties={pr.SESSION_EXPIRY_INTERVAL: 300})
    sub.subscribe(topic, 1)
    sub.send(pk.Disconnect())
    sub.expect_closed()
    pub = raw()
    pub.connect(unique("expiry-pub"))
    pub.send(pk.Publish(topic, b"short", 1, packet_id=1, properties={pr.MESSAGE_EXPIRY_INTERVAL: 1}))
    pub.send(pk.Publish(topic, b"long", 1, packet_id=2, properties={pr.MESSAGE_EXPIRY_INTERVAL: 100}))
    pub.expect(pk.PubAck)
    pub.expect(pk.PubAck)
    time.sleep(2.1)  # let the first message's lifetime pass
    again = raw()
    again.connect(client_id, clean_start=False, properties={pr.SESSION_EXPIRY_INTERVAL: 300})
    publish = again.expect(pk.Publish)
    assert publish.payload == b"long"
    assert 97 <= publish.properties[pr.MESSAGE_EXPIRY_INTERVAL] <= 99


def test_will_delay_lets_a_quick_reconnect_cancel_the_will(raw) -> None:
    client_id = unique("will-delay")
    topic = unique("will-delay-topic")
    watcher = raw()
    watcher.connect(unique("watcher"))
    watcher.subscribe(topic, 1)
    will = pk.Will(topic, b"late", 1, False, {pr.WILL_DELAY_INTERVAL: 2})
    first = raw()
    first.connect(client_id, will=will, properties={pr.SESSION_EXPIRY_INTERVAL: 60})
    first.close()
    second = raw()
    second.connect(client_id, clean_start=False, properties={pr.SESSION_EXPIRY_INTERVAL: 60})
    with pytest.raises(TimeoutError):
        watcher.recv(timeout=3)  # past the delay: the reconnect cancelled it
    # Now go away for good: the will arrives after its delay.
    third = raw()
    third.connect(client_id, will=will, properties={pr.SESSION_EXPIRY_INTERVAL: 60})
    third.close()
    start = time.monotonic()
    publish = watcher.expect(pk.Publish, timeout=6)
    assert publish.payload == b"late"
    assert time.monotonic() - start >= 1.0


def test_disconnect_with_will_message_reason_sends_the_will(raw) -> None:
    topic = unique("will-04")
    watcher = raw()
    watcher.connect(unique("watcher"))
    watcher.subscribe(topic, 0)
    client = raw()
    client.connect(unique("will-04-client"), will=pk.Will(topic, b"asked for"))
    client.send(pk.Disconnect(rc.DISCONNECT_WITH_WILL))
    assert watcher.expect(pk.Publish).payload == b"asked for"


def test_session_expires_after_its_interval(raw) -> None:
    client_id = unique("expire-session")
    first = raw()
    first.connect(client_id, properties={pr.SESSION_EXPIRY_INTERVAL: 1})
    first.subscribe(unique("x"), 1)
    first.send(pk.Disconnect())
    first.expect_closed()
    quick = raw()
    assert quick.connect(client_id, clean_start=False, properties={pr.SESSION_EXPIRY_INTERVAL: 1}).session_present
    quick.send(pk.Disconnect())
    quick.expect_closed()
    time.sleep(2.5)  # the session's lifetime passes (the broker checks once a second)
    late = raw()
    assert not late.connect(client_id, clean_start=False).session_present


def test_clean_start_discards_the_previous_session(raw) -> None:
    client_id = unique("clean")
    first = raw()
    first.connect(client_id, properties={pr.SESSION_EXPIRY_INTERVAL: 300})
    first.send(pk.Disconnect())
    first.expect_closed()
    second = raw()
    assert not second.connect(client_id, clean_start=True).session_present


@pytest.mark.parametrize("level", [4, 5])
def test_malformed_packet_closes_only_that_client(raw, level: int) -> None:
    topic = unique("bystander")
    bystander = raw(level)
    bystander.connect(unique("bystander"))
    bystander.subscribe(topic, 0)
    bad = raw(level)
    bad.connect(unique("bad"))
    bad.send(b"\x36\x03\x00\x01a")  # QoS 3
    seen = bad.expect_closed()
    if level == 5:
        assert seen[-1].reason_code == rc.MALFORMED_PACKET
    else:
        assert seen == []
    other = raw(level)
    other.connect(unique("other"))
    other.send(pk.Publish(topic, b"still fine"))
    assert bystander.expect(pk.Publish).payload == b"still fine"


def test_oversized_packet_is_refused_with_packet_too_large(raw) -> None:
    client = raw()
    client.connect(unique("big"))
    client.send(pk.Publish("big", b"x" * 70000))
    assert client.expect_closed()[-1].reason_code == rc.PACKET_TOO_LARGE


@pytest.mark.parametrize(
    ("packet", "reason"),
    [
        (pk.Connect(5, "again"), rc.PROTOCOL_ERROR),
        (pk.Publish("a/+", b"x"), rc.TOPIC_NAME_INVALID),
        (pk.Publish("a", b"x", properties={pr.SUBSCRIPTION_IDENTIFIER: [1]}), rc.PROTOCOL_ERROR),
        (pk.Connack(), rc.PROTOCOL_ERROR),
        (pk.Auth(0x18, {pr.AUTHENTICATION_METHOD: "x"}), rc.PROTOCOL_ERROR),
    ],
    ids=["second-connect", "wildcard-topic", "client-subscription-id", "connack-from-client", "auth"],
)
def test_protocol_violations_are_answered_with_disconnect(raw, packet: pk.Packet, reason: int) -> None:
    client = raw()
    client.connect(unique("violator"))
    client.send(packet)
    assert client.expect_closed()[-1].reason_code == reason


def test_first_packet_must_be_connect(raw) -> None:
    client = raw()
    client.send(pk.PingReq())
    assert client.expect_closed() == []


def test_invalid_subscribe_filter_gets_0x8f_and_unsubscribe_reports_missing(raw) -> None:
    client = raw()
    client.connect(unique("filters"))
    client.send(pk.Subscribe(1, [pk.SubscribeRequest("a/#/b", 0), pk.SubscribeRequest("ok/+", 1)]))
    assert client.expect(pk.Suback).reason_codes == [rc.TOPIC_FILTER_INVALID, 1]
    client.send(pk.Unsubscribe(2, ["ok/+", "never"]))
    assert client.expect(pk.Unsuback).reason_codes == [rc.SUCCESS, rc.NO_SUBSCRIPTION_EXISTED]


def test_packets_before_a_malformed_one_in_the_same_read_are_still_handled(raw) -> None:
    topic = unique("before-bad")
    watcher = raw()
    watcher.connect(unique("watcher"))
    watcher.subscribe(topic, 0)
    bad = raw()
    bad.connect(unique("half-bad"))
    bad.send(encode(pk.Publish(topic, b"made it"), 5) + b"\x36\x03\x00\x01a")
    assert bad.expect_closed()[-1].reason_code == rc.MALFORMED_PACKET
    assert watcher.expect(pk.Publish).payload == b"made it"


def test_random_garbage_from_many_clients_never_hurts_the_broker(gateway: GatewayProcess, raw) -> None:
    rng = random.Random(2)
    for index in range(30):
        client = raw(rng.choice([4, 5]))
        if index % 2:
            client.connect(unique("garbage"))
        client.send(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))))
        client.expect_closed(timeout=0.1)  # closed by the broker, or still waiting for more bytes
    survivor = raw()
    survivor.connect(unique("survivor"))
    survivor.send(pk.PingReq())
    survivor.expect(pk.PingResp)
    assert "Traceback" not in gateway.output()
    assert "internal error" not in gateway.output()


@pytest.mark.parametrize("level", [5, 4], ids=["mqtt5", "mqtt311"])
@pytest.mark.parametrize("will_topic", ["alarms/+", "#", "a/#/b", ""])
def test_a_will_topic_that_is_not_a_topic_name_is_refused_at_connect(raw, level: int, will_topic: str) -> None:
    """A will is published as written, so its topic must be a valid topic name: no wildcards, not empty.
    MQTT 5 gets CONNACK 0x90 (Topic Name invalid); 3.1.1 has no code for it and is closed unanswered."""
    client = raw(level)
    client.send(pk.Connect(level, unique("will"), True, 60, will=pk.Will(will_topic, b"gone", 1)))
    seen = client.expect_closed()
    if level == 5:
        assert [type(p) for p in seen] == [pk.Connack] and seen[0].reason_code == rc.TOPIC_NAME_INVALID
    else:
        assert not seen
    # The gateway serves the next client as ever.
    assert raw(level).connect(unique("after")).reason_code == rc.SUCCESS
