"""Wire-level behaviour against a real gateway process, with exact packets and reason codes.

The client here is a raw socket speaking through our codec, so each test can do what a library client
would hide: not acknowledge, reuse a packet id, send garbage, or watch the DUP flag. Each behaviour runs
under MQTT 3.1.1 and 5 (the ``level`` fixture) unless its docstring says why it exists in one only.
Behaviour that is about time passing (keep-alive, flapping, will delay, session and message expiry) is
tested on the fake clock in test_timing.py, not here by sleeping.
"""

from __future__ import annotations

import random

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.writer import encode
from testing.processes import GatewayProcess
from tests.broker.clients import RawClient, unique
from tests.broker.versions import durable


@pytest.fixture
def raw(gateway: GatewayProcess):
    clients: list[RawClient] = []

    def make(level: int = pk.MQTT_5) -> RawClient:
        client = RawClient(gateway.port, level)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def subscriber_and_publisher(raw, level: int, client_id: str, topic: str, qos: int,
                             **session: object) -> tuple[RawClient, RawClient]:
    """``client_id`` connected (``session``: its CONNECT's session fields) and subscribed to ``topic`` at
    ``qos``, and a publisher connected beside it."""
    sub = raw(level)
    sub.connect(client_id, **session)
    sub.subscribe(topic, qos)
    pub = raw(level)
    pub.connect(unique(f"{client_id}-pub"))
    return sub, pub


def test_connack_announces_limits_and_assigns_a_client_id(raw, level: int) -> None:
    """MQTT 5 announces its limits and the id it assigned as CONNACK properties; 3.1.1 has no properties,
    so its client is accepted with return code 0 and an empty CONNACK (the broker still names it)."""
    client = raw(level)
    connack = client.connect("", properties={pr.RECEIVE_MAXIMUM: 5} if level == pk.MQTT_5 else {})
    assert connack.reason_code == rc.SUCCESS
    if level == pk.MQTT_311:
        assert connack.properties == {}
        return
    assert connack.properties[pr.ASSIGNED_CLIENT_IDENTIFIER]
    assert connack.properties[pr.RECEIVE_MAXIMUM] == 20
    assert connack.properties[pr.MAXIMUM_PACKET_SIZE] == 65536
    assert connack.properties[pr.TOPIC_ALIAS_MAXIMUM] > 0


def test_an_empty_client_id_without_a_clean_session(raw, level: int) -> None:
    """3.1.1 (3.1.3-8) refuses it with return code 2 (read back as 0x85) and closes; MQTT 5 (3.1.3-6)
    assigns an id, and the session that id names is new."""
    client = raw(level)
    connack = client.connect("", clean_start=False)
    if level == pk.MQTT_311:
        assert connack.reason_code == rc.CLIENT_IDENTIFIER_NOT_VALID
        client.expect_closed()
    else:
        assert connack.reason_code == rc.SUCCESS and not connack.session_present
        assert connack.properties[pr.ASSIGNED_CLIENT_IDENTIFIER]


def test_enhanced_authentication_is_refused_with_bad_authentication_method(raw) -> None:
    """MQTT 5 only: 3.1.1 has no Authentication Method property and no AUTH packet."""
    client = raw()
    connack = client.connect(unique("auth"), properties={pr.AUTHENTICATION_METHOD: "SCRAM-SHA-1"})
    assert connack.reason_code == rc.BAD_AUTHENTICATION_METHOD
    client.expect_closed()


def test_unsupported_protocol_level_gets_return_code_1(raw) -> None:
    """Version-free: the CONNECT names level 6, which neither version is; the answer is the 3.1.1 return
    code 1 that both allow (MQTT 5 3.1.2.2)."""
    client = raw(4)
    client.send(b"\x10\x0c\x00\x04MQTT\x06\x02\x00\x3c\x00\x00")
    assert client.expect(pk.Connack).reason_code == rc.UNSUPPORTED_PROTOCOL_VERSION
    client.expect_closed()


def test_session_takeover_closes_the_old_connection(raw, level: int) -> None:
    """MQTT 5 tells the old connection why, DISCONNECT 0x8E; 3.1.1 has no server DISCONNECT, so it is
    closed without a word."""
    client_id = unique("takeover")
    old = raw(level)
    old.connect(client_id)
    new = raw(level)
    assert new.connect(client_id, clean_start=False).reason_code == 0
    seen = old.expect_closed()
    if level == pk.MQTT_5:
        assert seen and isinstance(seen[-1], pk.Disconnect) and seen[-1].reason_code == rc.SESSION_TAKEN_OVER
    else:
        assert seen == []


def test_unacknowledged_qos1_is_redelivered_with_dup_after_reconnect(raw, level: int) -> None:
    client_id, topic = unique("dup"), unique("dup-topic")
    sub, pub = subscriber_and_publisher(raw, level, client_id, topic, 1, **durable(level))
    pub.send(pk.Publish(topic, b"payload", 1, packet_id=1))
    pub.expect(pk.PubAck)
    first = sub.expect(pk.Publish)
    assert not first.dup
    sub.close()  # no PUBACK
    again = raw(level)
    connack = again.connect(client_id, **durable(level))
    assert connack.session_present
    redelivered = again.expect(pk.Publish)
    assert (redelivered.dup, redelivered.packet_id, redelivered.payload) == (True, first.packet_id, b"payload")
    again.send(pk.PubAck(redelivered.packet_id))
    again.send(pk.Disconnect())


def test_qos2_outbound_flow_resumes_with_pubrel_after_reconnect(raw, level: int) -> None:
    client_id, topic = unique("q2out"), unique("q2out-topic")
    sub, pub = subscriber_and_publisher(raw, level, client_id, topic, 2, **durable(level))
    pub.send(pk.Publish(topic, b"once", 2, packet_id=3))
    pub.expect(pk.PubRec)
    pub.send(pk.PubRel(3))
    pub.expect(pk.PubComp)
    publish = sub.expect(pk.Publish)
    sub.send(pk.PubRec(publish.packet_id))
    assert sub.expect(pk.PubRel).packet_id == publish.packet_id
    sub.close()  # no PUBCOMP
    again = raw(level)
    again.connect(client_id, **durable(level))
    assert again.expect(pk.PubRel).packet_id == publish.packet_id  # not the PUBLISH again
    again.send(pk.PubComp(publish.packet_id))
    again.send(pk.PingReq())
    again.expect(pk.PingResp)


def test_inbound_qos2_duplicates_are_suppressed_by_packet_id(raw, level: int) -> None:
    """A PUBREL for an id the broker no longer holds is completed all the same: MQTT 5 says so with
    PUBCOMP 0x92, 3.1.1 (no reason codes) with a plain PUBCOMP."""
    topic = unique("q2in")
    sub, pub = subscriber_and_publisher(raw, level, unique("q2in-sub"), topic, 2)
    pub.send(pk.Publish(topic, b"exactly once", 2, packet_id=9))
    pub.expect(pk.PubRec)
    pub.send(pk.Publish(topic, b"exactly once", 2, dup=True, packet_id=9))
    pub.expect(pk.PubRec)
    pub.send(pk.PubRel(9))
    assert pub.expect(pk.PubComp).reason_code == 0
    pub.send(pk.PubRel(9))  # unknown now
    unknown = pub.expect(pk.PubComp)
    assert (unknown.packet_id, unknown.reason_code) == (
        9, rc.PACKET_IDENTIFIER_NOT_FOUND if level == pk.MQTT_5 else 0)
    publish = sub.expect(pk.Publish)
    sub.send(pk.PubRec(publish.packet_id))
    sub.expect(pk.PubRel)
    sub.send(pk.PubComp(publish.packet_id))
    sub.send(pk.PingReq())
    assert isinstance(sub.recv(), pk.PingResp)  # and no second PUBLISH before it


def test_in_flight_window_is_bounded_by_the_clients_receive_maximum(raw) -> None:
    """MQTT 5 only: Receive Maximum is a CONNECT property (3.1.1's cap, ``max_inflight_messages``, is
    test_interop_inflight.py's)."""
    topic = unique("window")
    sub = raw()
    sub.connect(unique("window-sub"), properties={pr.RECEIVE_MAXIMUM: 2})
    sub.subscribe(topic, 1)
    pub = raw()
    pub.connect(unique("window-pub"))
    for index in range(1, 6):
        pub.send(pk.Publish(topic, str(index).encode(), 1, packet_id=index))
        pub.expect(pk.PubAck)
    # Every message is routed (all PUBACKs are in) and the broker writes a connection's bytes in order:
    # whatever it sent the subscriber arrives before the PINGRESP.
    sub.send(pk.PingReq())
    first, second = sub.expect(pk.Publish), sub.expect(pk.Publish)
    sub.expect(pk.PingResp)
    sub.send(pk.PubAck(first.packet_id))
    third = sub.expect(pk.Publish)
    assert [first.payload, second.payload, third.payload] == [b"1", b"2", b"3"]
    sub.send(pk.PubAck(second.packet_id))
    sub.send(pk.PubAck(third.packet_id))
    assert sub.expect(pk.Publish).payload == b"4"


def test_topic_aliases_in_both_directions(raw) -> None:
    """MQTT 5 only: topic aliases are a PUBLISH property."""
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
    """MQTT 5 only: topic aliases are a PUBLISH property."""
    pub = raw()
    maximum = pub.connect(unique("alias-max")).properties[pr.TOPIC_ALIAS_MAXIMUM]
    pub.send(pk.Publish("t", b"x", properties={pr.TOPIC_ALIAS: maximum + 1}))
    assert pub.expect_closed()[-1].reason_code == rc.TOPIC_ALIAS_INVALID


def test_disconnect_with_will_message_reason_sends_the_will(raw) -> None:
    """MQTT 5 only: 3.1.1's DISCONNECT has no reason code, and always discards the will."""
    topic = unique("will-04")
    watcher = raw()
    watcher.connect(unique("watcher"))
    watcher.subscribe(topic, 0)
    client = raw()
    client.connect(unique("will-04-client"), will=pk.Will(topic, b"asked for"))
    client.send(pk.Disconnect(rc.DISCONNECT_WITH_WILL))
    assert watcher.expect(pk.Publish).payload == b"asked for"


def test_clean_start_discards_the_previous_session(raw, level: int) -> None:
    client_id = unique("clean")
    first = raw(level)
    first.connect(client_id, **durable(level))
    first.send(pk.Disconnect())
    first.expect_closed()
    second = raw(level)
    assert not second.connect(client_id, clean_start=True).session_present


def test_malformed_packet_closes_only_that_client(raw, level: int) -> None:
    topic = unique("bystander")
    bystander, bad = subscriber_and_publisher(raw, level, unique("bystander"), topic, 0)
    bad.send(b"\x36\x03\x00\x01a")  # QoS 3
    seen = bad.expect_closed()
    if level == pk.MQTT_5:
        assert seen[-1].reason_code == rc.MALFORMED_PACKET
    else:
        assert seen == []
    other = raw(level)
    other.connect(unique("other"))
    other.send(pk.Publish(topic, b"still fine"))
    assert bystander.expect(pk.Publish).payload == b"still fine"


def test_oversized_packet_is_refused_with_packet_too_large(raw, level: int) -> None:
    """MQTT 5 says DISCONNECT 0x95; 3.1.1 has no server DISCONNECT: the connection is closed unanswered."""
    client = raw(level)
    client.connect(unique("big"))
    client.send(pk.Publish("big", b"x" * 70000))
    seen = client.expect_closed()
    if level == pk.MQTT_5:
        assert seen[-1].reason_code == rc.PACKET_TOO_LARGE
    else:
        assert seen == []


def _violations() -> list[object]:
    """(packet for the level, MQTT 5 reason) per level where the violation exists; 3.1.1 has no
    properties (a client's Subscription Identifier) and no AUTH packet."""
    both = [
        ("second-connect", lambda level: pk.Connect(level, "again"), rc.PROTOCOL_ERROR),
        ("wildcard-topic", lambda level: pk.Publish("a/+", b"x"), rc.TOPIC_NAME_INVALID),
        ("connack-from-client", lambda level: pk.Connack(), rc.PROTOCOL_ERROR),
    ]
    v5_only = [
        ("client-subscription-id", lambda level: pk.Publish("a", b"x", properties={pr.SUBSCRIPTION_IDENTIFIER: [1]}),
         rc.PROTOCOL_ERROR),
        ("auth", lambda level: pk.Auth(0x18, {pr.AUTHENTICATION_METHOD: "x"}), rc.PROTOCOL_ERROR),
    ]
    cases = [pytest.param(make, reason, level, id=f"{name}-{tag}")
             for name, make, reason in both for level, tag in ((pk.MQTT_311, "mqtt311"), (pk.MQTT_5, "mqtt5"))]
    return cases + [pytest.param(make, reason, pk.MQTT_5, id=f"{name}-mqtt5") for name, make, reason in v5_only]


@pytest.mark.parametrize(("make", "reason", "level"), _violations())
def test_protocol_violations_close_the_connection(raw, make, reason: int, level: int) -> None:
    """MQTT 5 answers with DISCONNECT and the reason; 3.1.1 closes without a word."""
    client = raw(level)
    client.connect(unique("violator"))
    client.send(make(level))
    seen = client.expect_closed()
    if level == pk.MQTT_5:
        assert seen[-1].reason_code == reason
    else:
        assert seen == []


def test_first_packet_must_be_connect(raw) -> None:
    """Version-free: before its CONNECT a connection has no protocol level."""
    client = raw()
    client.send(pk.PingReq())
    assert client.expect_closed() == []


def test_invalid_subscribe_filter_is_refused_and_unsubscribe_reports_missing(raw, level: int) -> None:
    """MQTT 5: SUBACK 0x8F and UNSUBACK 0x11 for a filter never subscribed; 3.1.1: SUBACK 0x80 (its only
    failure code) and an UNSUBACK without reason codes."""
    client = raw(level)
    client.connect(unique("filters"))
    client.send(pk.Subscribe(1, [pk.SubscribeRequest("a/#/b", 0), pk.SubscribeRequest("ok/+", 1)]))
    refused = rc.TOPIC_FILTER_INVALID if level == pk.MQTT_5 else 0x80
    assert client.expect(pk.Suback).reason_codes == [refused, 1]
    client.send(pk.Unsubscribe(2, ["ok/+", "never"]))
    unsuback = client.expect(pk.Unsuback)
    assert unsuback.packet_id == 2
    assert unsuback.reason_codes == ([rc.SUCCESS, rc.NO_SUBSCRIPTION_EXISTED] if level == pk.MQTT_5 else [])


def test_packets_before_a_malformed_one_in_the_same_read_are_still_handled(raw, level: int) -> None:
    topic = unique("before-bad")
    watcher, bad = subscriber_and_publisher(raw, level, unique("watcher"), topic, 0)
    bad.send(encode(pk.Publish(topic, b"made it"), level) + b"\x36\x03\x00\x01a")
    seen = bad.expect_closed()
    if level == pk.MQTT_5:
        assert seen[-1].reason_code == rc.MALFORMED_PACKET
    else:
        assert seen == []
    assert watcher.expect(pk.Publish).payload == b"made it"


def test_random_garbage_from_many_clients_never_hurts_the_broker(gateway: GatewayProcess, raw) -> None:
    """Both versions in one run: each garbage client picks its level at random."""
    rng = random.Random(2)
    for index in range(30):
        client = raw(rng.choice([pk.MQTT_311, pk.MQTT_5]))
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


@pytest.mark.parametrize("will_topic", ["alarms/+", "#", "a/#/b", ""])
def test_a_will_topic_that_is_not_a_topic_name_is_refused_at_connect(raw, level: int, will_topic: str) -> None:
    """A will is published as written, so its topic must be a valid topic name: no wildcards, not empty.
    MQTT 5 gets CONNACK 0x90 (Topic Name invalid); 3.1.1 has no code for it and is closed unanswered."""
    client = raw(level)
    client.send(pk.Connect(level, unique("will"), True, 60, will=pk.Will(will_topic, b"gone", 1)))
    seen = client.expect_closed()
    if level == pk.MQTT_5:
        assert [type(p) for p in seen] == [pk.Connack] and seen[0].reason_code == rc.TOPIC_NAME_INVALID
    else:
        assert not seen
    # The gateway serves the next client as ever.
    assert raw(level).connect(unique("after")).reason_code == rc.SUCCESS
