"""Codec round trips for every packet type and property of MQTT 3.1.1 and 5, plus fuzzed garbage.

The property tests generate packets the given protocol version can express, encode them, feed the bytes
back (whole and split at a random point) and expect the same packets. Garbage must only ever produce
``MqttProtocolError`` (or nothing, if it looks like an incomplete packet).
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.reasons import (
    MALFORMED_PACKET,
    PACKET_TOO_LARGE,
    PROTOCOL_ERROR,
    TOPIC_NAME_INVALID,
    UNSUPPORTED_PROTOCOL_VERSION,
    V311_CONNACK_REASONS,
    MqttProtocolError,
)
from appliance.broker.codec.writer import encode, encode_ack, puback_success
from testing.campaigns import campaign

SETTINGS = campaign(150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
topic = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"), min_size=1, max_size=30)
binary = st.binary(max_size=40)
packet_id = st.integers(1, 65535)
u16 = st.integers(0, 65535)
u32 = st.integers(0, 2**32 - 1)

VALUE_STRATEGIES = {
    pr.BYTE: st.integers(0, 1),
    pr.U16: st.integers(1, 65535),
    pr.U32: st.integers(1, 2**32 - 1),
    pr.VARINT: st.integers(1, 268_435_455),
    pr.UTF8: text,
    pr.BINARY: binary,
}


def properties_for(kind: int) -> st.SearchStrategy[dict]:
    """Any subset of the properties ``kind`` may carry, with valid values."""
    allowed = sorted(ident for ident, kinds in pr.ALLOWED.items() if kind in kinds)
    entries = {}
    for ident in allowed:
        type_ = pr.TYPES[ident]
        if ident == pr.USER_PROPERTY:
            entries[ident] = st.lists(st.tuples(text, text), min_size=1, max_size=3)
        elif ident == pr.SUBSCRIPTION_IDENTIFIER:
            entries[ident] = st.lists(VALUE_STRATEGIES[pr.VARINT], min_size=1, max_size=1 if kind == pk.SUBSCRIBE else 3)
        else:
            entries[ident] = VALUE_STRATEGIES[type_]
    return st.fixed_dictionaries({}, optional=entries)


def packets(v5: bool) -> st.SearchStrategy[pk.Packet]:
    props = (lambda kind: properties_for(kind)) if v5 else (lambda kind: st.just({}))
    reason = st.integers(0, 255) if v5 else st.just(0)
    will = st.builds(pk.Will, topic, binary, st.integers(0, 2), st.booleans(), props(pr.WILL))
    username = st.none() | text
    connect = st.builds(
        lambda level, client_id, clean, ka, user, pw, w, p: pk.Connect(
            level, client_id, clean, ka, user, pw if (v5 or user is not None) else None, w, p,
            "MQIsdp" if level == 3 else "MQTT",
        ),
        st.just(5) if v5 else st.sampled_from([3, 4]),
        text, st.booleans(), u16, username, st.none() | binary, st.none() | will, props(pr.CONNECT),
    )
    connack = st.builds(
        pk.Connack,
        st.booleans(),
        st.integers(0, 255) if v5 else st.sampled_from(sorted(V311_CONNACK_REASONS.values())),
        props(pr.CONNACK),
    )
    publish = st.integers(0, 2).flatmap(
        lambda qos: st.builds(
            pk.Publish, topic, binary, st.just(qos), st.booleans(), st.booleans() if qos else st.just(False),
            packet_id if qos else st.none(), props(pr.PUBLISH),
        )
    )
    acks = [st.builds(cls, packet_id, reason, props(cls.type)) for cls in (pk.PubAck, pk.PubRec, pk.PubRel, pk.PubComp)]
    request = st.builds(
        pk.SubscribeRequest, topic, st.integers(0, 2),
        st.booleans() if v5 else st.just(False), st.booleans() if v5 else st.just(False),
        st.integers(0, 2) if v5 else st.just(0),
    )
    subscribe = st.builds(pk.Subscribe, packet_id, st.lists(request, min_size=1, max_size=4), props(pr.SUBSCRIBE))
    suback_codes = st.lists(st.integers(0, 255) if v5 else st.sampled_from([0, 1, 2, 0x80]), min_size=1, max_size=4)
    suback = st.builds(pk.Suback, packet_id, suback_codes, props(pr.SUBACK))
    unsubscribe = st.builds(pk.Unsubscribe, packet_id, st.lists(topic, min_size=1, max_size=4), props(pr.UNSUBSCRIBE))
    unsuback = st.builds(pk.Unsuback, packet_id, st.lists(st.integers(0, 255), min_size=1, max_size=4) if v5 else st.just([]),
                         props(pr.UNSUBACK))
    simple = [st.just(pk.PingReq()), st.just(pk.PingResp()), st.builds(pk.Disconnect, reason, props(pr.DISCONNECT))]
    if v5:
        simple.append(st.builds(pk.Auth, reason, props(pr.AUTH)))
    return st.one_of(connect, connack, publish, *acks, subscribe, suback, unsubscribe, unsuback, *simple)


def reader_for(packet: pk.Packet, level: int) -> PacketReader:
    return PacketReader(protocol_level=5 if level == 5 else 4)


@pytest.mark.parametrize("level", [4, 5])
def test_round_trip_every_packet_type(level: int) -> None:
    @SETTINGS
    @given(st.lists(packets(level == 5), min_size=1, max_size=5), st.data())
    def check(batch: list[pk.Packet], data: st.DataObject) -> None:
        wire = b"".join(encode(packet, level) for packet in batch)
        reader = PacketReader(protocol_level=level)
        assert reader.feed(wire) == batch
        split = data.draw(st.integers(0, len(wire)))
        reader = PacketReader(protocol_level=level)
        assert reader.feed(wire[:split]) + reader.feed(wire[split:]) == batch
        assert len(reader.pending) == 0

    check()


def test_byte_by_byte_feeding_yields_the_same_packets() -> None:
    batch = [
        pk.Connect(5, "c", True, 30, "u", b"p", pk.Will("w", b"x" * 300, 1, True, {pr.WILL_DELAY_INTERVAL: 5}),
                   {pr.SESSION_EXPIRY_INTERVAL: 60}),
        pk.Publish("t/" + "x" * 200, b"y" * 20000, 1, False, False, 9, {pr.USER_PROPERTY: [("k", "v")]}),
        pk.PingReq(),
    ]
    wire = b"".join(encode(packet, 5) for packet in batch)
    reader = PacketReader(protocol_level=5)
    out: list[pk.Packet] = []
    for index in range(len(wire)):
        out += reader.feed(wire[index : index + 1])
    assert out == batch


@SETTINGS
@given(st.binary(max_size=300), st.sampled_from([4, 5]))
def test_garbage_only_raises_protocol_errors(garbage: bytes, level: int) -> None:
    reader = PacketReader(max_packet_size=1000, protocol_level=level)
    try:
        reader.feed(garbage)
    except MqttProtocolError as exc:
        assert 0x80 <= exc.reason_code <= 0xA2


@SETTINGS
@given(st.lists(packets(True), min_size=1, max_size=3), st.data())
def test_mutated_valid_packets_only_raise_protocol_errors(batch: list[pk.Packet], data: st.DataObject) -> None:
    wire = bytearray(b"".join(encode(packet, 5) for packet in batch))
    for _ in range(data.draw(st.integers(1, 4))):
        wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(MqttProtocolError):
        PacketReader(protocol_level=5).feed(bytes(wire))


@pytest.mark.parametrize(
    ("wire", "level", "reason"),
    [
        (b"\x30\x02\x00\x00", 4, None),  # empty topic is a session-level error, not a codec one
        (b"\x36\x03\x00\x01a", 4, MALFORMED_PACKET),  # QoS 3
        (b"\x38\x03\x00\x01a", 4, MALFORMED_PACKET),  # DUP on QoS 0
        (b"\x32\x05\x00\x01a\x00\x00", 4, PROTOCOL_ERROR),  # packet id 0
        (b"\x80\x05\x00\x01\x00\x01a", 4, MALFORMED_PACKET),  # SUBSCRIBE with wrong fixed flags
        (b"\x82\x02\x00\x01", 4, PROTOCOL_ERROR),  # SUBSCRIBE without filters
        (b"\x82\x06\x00\x01\x00\x01a\x04", 4, MALFORMED_PACKET),  # reserved option bits in 3.1.1
        (b"\x82\x07\x00\x01\x00\x00\x01a\x30", 5, MALFORMED_PACKET),  # retain handling 3
        (b"\xc0\x01\x00", 4, MALFORMED_PACKET),  # PINGREQ with a body
        (b"\xf0\x00", 4, MALFORMED_PACKET),  # AUTH in 3.1.1
        (b"\x00\x00", 4, MALFORMED_PACKET),  # reserved type 0
        (b"\x30\xff\xff\xff\xff\x01", 4, MALFORMED_PACKET),  # five-byte remaining length
        (b"\x30\x04\x00\x02\xc3\x28", 4, MALFORMED_PACKET),  # invalid UTF-8 topic
        (b"\x30\x04\x00\x02a\x00", 4, MALFORMED_PACKET),  # NUL in topic
        (b"\x30\x04\x00\x02a#", 4, TOPIC_NAME_INVALID),  # wildcard in a topic name
        (b"\x30\x04\x00\x02+/", 4, TOPIC_NAME_INVALID),
        (b"\x40\x02\x00\x00", 4, PROTOCOL_ERROR),  # PUBACK with packet id 0 (the short form's own parser)
        (b"\x40\x02\x00\x00", 5, PROTOCOL_ERROR),
        (b"\x41\x02\x00\x01", 4, MALFORMED_PACKET),  # PUBACK with reserved flags
        (b"\x40\x01\x00", 5, MALFORMED_PACKET),  # truncated packet id
        (b"\x40\x05\x00\x01\x00\x02\x26", 5, MALFORMED_PACKET),  # property runs past the end
        (b"\x40\x06\x00\x01\x00\x02\x24\x01", 5, PROTOCOL_ERROR),  # maximum QoS in a PUBACK
        (b"\x30\x09\x00\x01a\x05\x02\x00\x00\x00\x01", 5, None),  # message expiry: fine
        (b"\x30\x0e\x00\x01a\x08\x02\x00\x00\x00\x01\x02\x00\x00\x00\x01", 5, MALFORMED_PACKET),
        (b"\x30\x0e\x00\x01a\x0a\x02\x00\x00\x00\x01\x02\x00\x00\x00\x01", 5, PROTOCOL_ERROR),  # duplicate property
        (b"\x10\x0c\x00\x04MQTT\x06\x02\x00\x3c\x00\x00", 4, UNSUPPORTED_PROTOCOL_VERSION),
        (b"\x10\x0c\x00\x04MQTX\x04\x02\x00\x3c\x00\x00", 4, MALFORMED_PACKET),
        (b"\x10\x0c\x00\x04MQTT\x04\x03\x00\x3c\x00\x00", 4, MALFORMED_PACKET),  # reserved connect flag
        (b"\x10\x0c\x00\x04MQTT\x04\x1a\x00\x3c\x00\x00", 4, MALFORMED_PACKET),  # will QoS without will flag
        (b"\x10\x0e\x00\x04MQTT\x04\x42\x00\x3c\x00\x00\x00\x00", 4, MALFORMED_PACKET),  # password, no user
    ],
)
def test_specific_malformations_have_the_right_reason(wire: bytes, level: int, reason: int | None) -> None:
    reader = PacketReader(protocol_level=level)
    if reason is None:
        assert len(reader.feed(wire)) == 1
    else:
        with pytest.raises(MqttProtocolError) as info:
            reader.feed(wire)
        assert info.value.reason_code == reason


def test_oversized_packet_is_refused_from_its_header_alone() -> None:
    reader = PacketReader(max_packet_size=100)
    with pytest.raises(MqttProtocolError) as info:
        reader.feed(b"\x30\xe8\x07")  # announces 1000 bytes; nothing else has arrived
    assert info.value.reason_code == PACKET_TOO_LARGE


def test_connect_switches_the_reader_to_mqtt5_for_the_following_packets() -> None:
    wire = encode(pk.Connect(5, "c", properties={pr.RECEIVE_MAXIMUM: 10}), 5)
    wire += encode(pk.Publish("t", b"x", 0, properties={pr.CONTENT_TYPE: "text/plain"}), 5)
    reader = PacketReader()
    connect, publish = reader.feed(wire)
    assert connect.properties == {pr.RECEIVE_MAXIMUM: 10}
    assert publish.properties == {pr.CONTENT_TYPE: "text/plain"}


def test_short_acks_default_to_success_in_mqtt5() -> None:
    reader = PacketReader(protocol_level=5)
    assert reader.feed(b"\x40\x02\x00\x07\x50\x03\x00\x08\x10\xe0\x00") == [
        pk.PubAck(7), pk.PubRec(8, 0x10), pk.Disconnect()
    ]


def test_topic_names_are_decoded_once_and_every_copy_is_still_checked() -> None:
    """The reader remembers validated topic names (a device repeats its few topics): the second PUBLISH
    to a topic gets the very same ``str``, and an invalid name is never remembered."""
    reader = PacketReader(protocol_level=5)
    first, second = reader.feed(encode(pk.Publish("site/1/temp", b"1"), 5) * 2)
    assert first.topic == "site/1/temp" and second.topic is first.topic
    for _ in range(2):
        with pytest.raises(MqttProtocolError) as info:
            reader.feed(b"\x30\x05\x00\x02a+\x00")
        assert info.value.reason_code == TOPIC_NAME_INVALID


@pytest.mark.parametrize(
    "packet",
    [
        pk.PubAck(1, 0x87, {pr.REASON_STRING: "no"}),
        pk.PubRec(2, 0x97),
        pk.PubRel(3, 0x92),
        pk.PubComp(4, 0x92),
        pk.Disconnect(0x8D, {pr.REASON_STRING: "keep alive"}),
        pk.Unsuback(5, [0x11, 0x87]),
    ],
    ids=lambda p: type(p).__name__,
)
def test_the_writer_drops_mqtt5_reason_codes_for_mqtt311(packet: pk.Packet) -> None:
    """Handlers always pass MQTT 5 reason codes; the writer is the one place 3.1.1 loses them."""
    wire = encode(packet, pk.MQTT_311)
    assert wire[1] == (2 if isinstance(packet, (pk.PubAck, pk.PubRec, pk.PubRel, pk.PubComp, pk.Unsuback)) else 0)
    assert encode(packet, pk.MQTT_5) != wire


def test_the_writer_maps_failure_codes_to_mqtt311_ones() -> None:
    assert encode(pk.Suback(1, [1, 0x87, 0x8F]), pk.MQTT_311)[-3:] == bytes((1, 0x80, 0x80))
    assert encode(pk.Connack(False, 0x87), pk.MQTT_311) == bytes((0x20, 2, 0, 5))
    assert encode(pk.Connack(False, 0x86), pk.MQTT_311) == bytes((0x20, 2, 0, 4))
    # A refusal because of the server's state is 3 "server unavailable" for 3.1.1, whoever encodes it: the
    # login gate (0x89 busy, 0x9F rate exceeded) and a store that cannot commit (0x97 disk full, 0x80).
    for reason in (0x89, 0x9F, 0x97, 0x80):
        assert encode(pk.Connack(False, reason), pk.MQTT_311) == bytes((0x20, 2, 0, 3)), hex(reason)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_every_part_of_a_publish_is_bytes_whatever_the_reads_were(kind: type) -> None:
    """The payload and the received frame are kept in messages (and hashed, stored, forwarded): they are
    bytes whether a read was bytes or something like it, and whether the packet came whole or in parts."""
    wire = encode(pk.Publish("a/b", b"payload", 1, packet_id=7), pk.MQTT_311)
    for cut in (len(wire), 3):
        reader = PacketReader()
        packets = reader.feed(kind(wire[:cut])) + reader.feed(kind(wire[cut:]))
        [publish] = packets
        assert isinstance(publish, pk.Publish)
        assert type(publish.payload) is bytes and publish.payload == b"payload"
        assert type(publish.frame) is bytes and publish.frame == wire


@given(st.integers(1, 65535), st.sampled_from([pk.MQTT_311, pk.MQTT_5]))
def test_the_success_puback_shortcut_writes_what_encode_ack_writes(packet_id: int, level: int) -> None:
    # The publish handler writes an accepted QoS 1 PUBLISH's PUBACK with ``puback_success``; a reader
    # must get the same packet back as from the general writer.
    assert puback_success(packet_id) == encode_ack(pk.PUBACK, packet_id, level)
    assert PacketReader(protocol_level=level).feed(puback_success(packet_id)) == [pk.PubAck(packet_id)]
