"""What one packet may make the broker build (issue 12, items 4 and 7): topic depth (``max_topic_levels``)
and user properties per packet (``max_user_properties``), on the fake clock (``tests/broker/pair.py``).

Costs are measured as the CPU time of the handling thread (``time.thread_time``: what the event loop would
spend, not what the shared test machine's scheduler adds) and as the peak of ``tracemalloc``.
"""

from __future__ import annotations

import functools
import logging
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.reasons import MqttProtocolError
from appliance.broker.codec.writer import encode
from appliance.broker.handlers.subscribe import MAX_SUBSCRIPTIONS_PER_CLIENT
from appliance.broker.routing.topic_tree import (
    SubscriptionOptions,
    SubscriptionTree,
    TopicError,
)
from testing.campaigns import campaign
from tests.broker.pair import BrokerPair, subscriber_and_publisher
from tests.broker.test_timing import LEVELS, durable, publishes
from tests.broker.test_topic_tree import reference_matches

#: The issue's probe: a SUBSCRIBE of a 16,000-level filter.
DEEP = 16_000
DEEP_FILTER = "/" * (DEEP - 1)
#: Budgets for handling that probe, from the issue: under 1 MB and 10 ms (before: 135 MB and 1.4 s).
MEMORY_BUDGET = 1_000_000
TIME_BUDGET = 0.010


class Meter:
    """Measures each named step of a scenario, either its peak allocation (``tracemalloc``) or its CPU time:
    never both in one run, as tracing allocations slows Python code down tenfold."""

    def __init__(self, memory: bool) -> None:
        self.memory = memory
        self.costs: dict[str, float] = {}

    @contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        if self.memory:
            tracemalloc.start()
            try:
                yield
                self.costs[step] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        else:
            started = time.thread_time()
            yield
            self.costs[step] = time.thread_time() - started


def costs(scenario: Callable[[Meter], None]) -> tuple[dict[str, float], dict[str, float]]:
    """Run ``scenario`` twice: (peak bytes, CPU seconds) of each of its steps."""
    memory, cpu = Meter(memory=True), Meter(memory=False)
    scenario(memory)
    scenario(cpu)
    return memory.costs, cpu.costs


def assert_within_budget(memory: dict[str, float], cpu: dict[str, float]) -> None:
    for step in memory:
        assert memory[step] < MEMORY_BUDGET and cpu[step] < TIME_BUDGET, (step, memory[step], cpu[step])


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[BrokerPair]:
    pair = BrokerPair(tmp_path)
    yield pair
    pair.stop()


def refused_filter_code(level: int) -> int:
    return rc.TOPIC_FILTER_INVALID if level == pk.MQTT_5 else 0x80


# -- 4: max_topic_levels --------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_a_16000_level_subscribe_is_refused_cheaply_by_default(tmp_path: Path, level: int) -> None:
    def scenario(meter: Meter) -> None:
        pair = BrokerPair(tmp_path / f"memory-{meter.memory}")
        try:
            client = pair.client(level)
            client.connect("deep", **durable(level))  # type: ignore[arg-type]
            with meter("subscribe"):
                client.send(pk.Subscribe(1, [pk.SubscribeRequest(DEEP_FILTER, 1), pk.SubscribeRequest("ok/+", 1)]))
            assert client.expect(pk.Suback).reason_codes == [refused_filter_code(level), 1]
            assert set(pair.broker.tree.subscriptions_of("deep")) == {"ok/+"}
        finally:
            pair.stop()

    assert_within_budget(*costs(scenario))


@pytest.mark.parametrize("level", LEVELS)
def test_a_16000_level_subscribe_within_a_raised_limit_costs_little(tmp_path: Path, level: int) -> None:
    """Accepted, stored for a durable session, matched, unsubscribed: each step linear in the filter."""

    def scenario(meter: Meter) -> None:
        pair = BrokerPair(tmp_path / f"memory-{meter.memory}", max_topic_levels=DEEP)
        try:
            client = pair.client(level)
            client.connect("deep", **durable(level))  # type: ignore[arg-type]
            with meter("subscribe"):
                client.send(pk.Subscribe(1, [pk.SubscribeRequest(DEEP_FILTER, 1)]))
            assert client.expect(pk.Suback).reason_codes == [1]
            with meter("publish"):
                client.send(pk.Publish(DEEP_FILTER, b"deep", 0))
            assert [m.payload for m in publishes(client.received())] == [b"deep"]
            with meter("unsubscribe"):
                client.send(pk.Unsubscribe(2, [DEEP_FILTER]))
            assert client.expect(pk.Unsuback).reason_codes in ([rc.SUCCESS], [])
            assert pair.broker.tree.node_count() == 0
        finally:
            pair.stop()

    assert_within_budget(*costs(scenario))


def test_deep_filters_sharing_prefixes_match_and_unsubscribe_in_linear_time() -> None:
    """60 filters of about 8,000 levels that share prefixes of every length split one another's edges;
    none of that may cost more than the filters' own length (quadratic work would take seconds)."""
    filters = ["a/" * (DEEP // 2 - 1 - step * 193) + tail for step in range(20) for tail in ("b", "+", "#")]
    topic = "a/" * (DEEP // 2 - 1) + "b"
    # The exact filter, its "+" twin and every "#" one (the regex reference takes seconds at this depth).
    expected = {f"c{i}" for i, f in enumerate(filters) if f.endswith("#") or f in (topic, topic[:-1] + "+")}
    assert len(expected) == 22

    def scenario(meter: Meter) -> None:
        tree = SubscriptionTree(DEEP)
        with meter("subscribe"):
            for index, topic_filter in enumerate(filters):
                tree.subscribe(f"c{index}", topic_filter, SubscriptionOptions(1))
        with meter("match"):
            matched = tree.match(topic)
        assert set(matched.subscribers) == expected
        with meter("unsubscribe"):
            for index, topic_filter in enumerate(filters):
                assert tree.unsubscribe(f"c{index}", topic_filter)
        assert tree.node_count() == 0

    memory, cpu = costs(scenario)
    # 60 filters of ~16 KB each: budgets for the whole batch, 40 times the single filter's.
    assert memory["subscribe"] < 40 * MEMORY_BUDGET and cpu["subscribe"] < 40 * TIME_BUDGET, (memory, cpu)
    assert cpu["match"] < 10 * TIME_BUDGET and cpu["unsubscribe"] < 40 * TIME_BUDGET, cpu


@pytest.mark.parametrize("level", LEVELS)
def test_a_publish_deeper_than_the_limit_ends_the_connection(tmp_path: Path, level: int) -> None:
    pair = BrokerPair(tmp_path, max_topic_levels=8)
    try:
        subscriber = pair.client(level)
        subscriber.connect("sub")
        subscriber.subscribe("#")
        publisher = pair.client(level)
        publisher.connect("pub")
        publisher.send(pk.Publish("a/" * 7 + "b", b"eight levels", 0))
        assert [m.payload for m in publishes(subscriber.received())] == [b"eight levels"]
        publisher.send(pk.Publish("a/" * 8 + "b", b"nine levels", 0))
        assert publisher.closed
        if level == pk.MQTT_5:
            assert publisher.expect(pk.Disconnect).reason_code == rc.TOPIC_NAME_INVALID
        else:
            assert publisher.received() == []
        assert subscriber.received() == []
    finally:
        pair.stop()


@pytest.mark.parametrize("level", LEVELS)
def test_a_will_topic_deeper_than_the_limit_is_refused(pair: BrokerPair, level: int) -> None:
    client = pair.client(level)
    client.send(pk.Connect(level, "willing", will=pk.Will("/" * 200, b"bye", 0, False, {})))
    assert client.closed
    if level == pk.MQTT_5:
        assert client.expect(pk.Connack).reason_code == rc.TOPIC_NAME_INVALID
    else:
        assert client.received() == []
    assert "willing" not in pair.broker.sessions


def test_a_stored_subscription_deeper_than_the_limit_is_skipped_at_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A durable session stored by a gateway with a higher limit (or none, before it existed) must not
    rebuild a 16,000-level filter at every start: it loses that one subscription, with a log line."""
    before = BrokerPair(tmp_path, max_topic_levels=DEEP)
    client = before.client(pk.MQTT_5)
    client.connect("old", **durable(pk.MQTT_5))  # type: ignore[arg-type]
    client.send(pk.Subscribe(1, [pk.SubscribeRequest(DEEP_FILTER, 1), pk.SubscribeRequest("kept/#", 1)]))
    assert client.expect(pk.Suback).reason_codes == [1, 1]
    client.drop()
    before.stop()
    caplog.set_level(logging.WARNING, "appliance.broker")
    after = BrokerPair(tmp_path)
    try:
        assert set(after.broker.tree.subscriptions_of("old")) == {"kept/#"}
        assert any("dropping stored subscription" in r.getMessage() for r in caplog.records)
    finally:
        after.stop()


def test_a_stored_retained_message_deeper_than_the_limit_is_skipped_at_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = BrokerPair(tmp_path, max_topic_levels=DEEP)
    publisher = before.client(pk.MQTT_5)
    publisher.connect("pub")
    publisher.send(pk.Publish(DEEP_FILTER, b"deep", 1, retain=True, packet_id=1),
                   pk.Publish("shallow", b"kept", 1, retain=True, packet_id=2))
    assert [p.reason_code for p in publisher.received()] == [rc.SUCCESS, rc.SUCCESS]
    before.stop()
    caplog.set_level(logging.WARNING, "appliance.broker")
    after = BrokerPair(tmp_path)
    try:
        assert [m.topic for m in after.broker.retained.matching("#", after.runtime.now())] == ["shallow"]
        assert any("skipping the stored retained message" in r.getMessage() for r in caplog.records)
    finally:
        after.stop()


@campaign(200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.sampled_from(["a", "", "+", "#", "b"])).filter(lambda s: s != (1, "")),
                min_size=1, max_size=20),
       st.lists(st.integers(1, 12), min_size=1, max_size=5))
def test_any_depth_is_refused_or_matched_right_and_costs_what_it_holds(
    shapes: list[tuple[int, str]], topic_depths: list[int]
) -> None:
    """Filters of every depth around a limit of 8: the deeper ones are refused, the tree agrees with the
    reference matcher, it never holds more nodes than its filters have levels, and removing them all
    gives every node back."""
    tree = SubscriptionTree(8)
    live: dict[str, str] = {}
    for index, (depth, last) in enumerate(shapes):
        topic_filter = "/".join(["a"] * (depth - 1) + [last])
        client_id = f"c{index}"
        if depth > 8:
            with pytest.raises(TopicError, match="levels"):
                tree.subscribe(client_id, topic_filter, SubscriptionOptions())
            continue
        tree.subscribe(client_id, topic_filter, SubscriptionOptions())
        live[client_id] = topic_filter
    assert tree.node_count() <= sum(f.count("/") + 1 for f in live.values())
    for depth in topic_depths:
        topic = "/".join(["a"] * depth)
        expected = {c for c, f in live.items() if reference_matches(f, topic)}
        assert set(tree.match(topic).subscribers) == expected
    for client_id, topic_filter in live.items():
        assert tree.unsubscribe(client_id, topic_filter)
    assert tree.node_count() == 0


DEPTHS = st.integers(0, 40)


@pytest.mark.parametrize("level", LEVELS)
@campaign(40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(filters=st.lists(st.tuples(DEPTHS, st.sampled_from(["x", "+", "#", ""])), min_size=1, max_size=4),
       topics=st.lists(DEPTHS, max_size=3))
def test_hostile_depths_never_crash_and_cost_at_most_their_bytes(
    caplog: pytest.LogCaptureFixture, level: int, filters: list[tuple[int, str]], topics: list[int]
) -> None:
    caplog.clear()
    pair = BrokerPair(None, max_topic_levels=16)
    try:
        client = pair.client(level)
        client.connect("hostile")
        requests = [pk.SubscribeRequest("/".join(["x"] * depth + [last]), 0) for depth, last in filters]
        client.send(pk.Subscribe(1, requests))
        codes = client.expect(pk.Suback).reason_codes
        # An empty filter (depth 0, last level "") is invalid at any depth limit (MQTT 4.7.3).
        assert codes == [0 if depth < 16 and request.topic_filter else refused_filter_code(level)
                         for (depth, _), request in zip(filters, requests, strict=True)]
        for depth in topics:
            if client.closed:
                break
            client.send(pk.Publish("/".join(["x"] * (depth + 1)), b"", 0))
            if depth >= 16:
                assert client.closed
        assert pair.broker.tree.node_count() <= sum(depth + 1 for depth, _ in filters)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, errors[0].getMessage()
    finally:
        pair.stop()


# -- 7: max_user_properties -----------------------------------------------------------------------------

@functools.cache
def many_properties() -> bytes:
    """The issue's probe: a 2.8 MB PUBLISH of 400,000 one-character user properties (before: ~1 s to decode).
    Built on first use, not at import: encoding it costs about 0.5 s, which every test worker paid at
    collection whether or not it ran these tests."""
    return encode(pk.Publish("t", b"x", 1, packet_id=1, properties={pr.USER_PROPERTY: [("a", "b")] * 400_000}),
                  pk.MQTT_5)


def test_400000_user_properties_are_refused_after_the_64th() -> None:
    probe = many_properties()  # built before the meters run: the probe is the test's, not the reader's

    def scenario(meter: Meter) -> None:
        reader = PacketReader(protocol_level=pk.MQTT_5)
        reader.max_user_properties = 64
        with meter("decode"), pytest.raises(MqttProtocolError) as refused:
            reader.feed(probe)
        assert refused.value.reason_code == rc.QUOTA_EXCEEDED

    memory, cpu = costs(scenario)
    assert len(probe) > 2_800_000
    # The frame itself is the test's; the reader's framing copies it once (a partial read stays buffered).
    assert memory["decode"] < MEMORY_BUDGET and cpu["decode"] < TIME_BUDGET, (memory, cpu)


def test_the_broker_ends_a_publisher_of_400000_user_properties_at_once(pair: BrokerPair) -> None:
    subscriber, publisher = subscriber_and_publisher(pair, pk.MQTT_5, qos=1)
    probe = many_properties()
    started = time.thread_time()
    publisher.send(probe)
    assert time.thread_time() - started < TIME_BUDGET
    assert publisher.closed
    assert publisher.expect(pk.Disconnect).reason_code == rc.QUOTA_EXCEEDED
    assert subscriber.received() == []


def test_user_properties_up_to_the_limit_are_forwarded_in_order(pair: BrokerPair) -> None:
    subscriber, publisher = subscriber_and_publisher(pair, pk.MQTT_5, qos=1)
    sent = [(f"k{i}", f"v{i}") for i in range(64)]
    publisher.send(pk.Publish("t", b"x", 1, packet_id=1, properties={pr.USER_PROPERTY: sent}))
    assert publisher.expect(pk.PubAck).reason_code == rc.SUCCESS
    [delivered] = publishes(subscriber.received())
    assert delivered.properties[pr.USER_PROPERTY] == sent


def test_a_connect_with_too_many_user_properties_gets_connack_quota_exceeded(tmp_path: Path) -> None:
    pair = BrokerPair(tmp_path, max_user_properties=3)
    try:
        client = pair.client(pk.MQTT_5)
        client.send(pk.Connect(pk.MQTT_5, "chatty", properties={pr.USER_PROPERTY: [("a", "b")] * 4}))
        assert client.expect(pk.Connack).reason_code == rc.QUOTA_EXCEEDED
        assert client.closed
    finally:
        pair.stop()


PROPERTY_BLOCKS = st.lists(st.one_of(
    st.tuples(st.just(pr.USER_PROPERTY), st.tuples(st.text(max_size=3), st.text(max_size=3))),
    st.tuples(st.just(pr.SUBSCRIPTION_IDENTIFIER), st.integers(1, 300)),
    st.tuples(st.just(pr.CONTENT_TYPE), st.text(max_size=3)),
), max_size=40)


@campaign(300, deadline=None)
@given(PROPERTY_BLOCKS, st.integers(1, 16), st.sampled_from([pr.PUBLISH, pr.SUBSCRIBE, pr.CONNECT]))
def test_any_property_block_is_decoded_or_refused_within_the_cap(
    entries: list[tuple[int, object]], cap: int, kind: int
) -> None:
    """Whatever the block holds, decoding builds at most ``cap`` values per repeatable property: it
    returns them all when there are no more than that, else refuses with 0x97 (or another reason the
    block earns first: a property this packet may not carry, a repeated single property)."""
    raw = bytearray()
    for ident, value in entries:
        one = pr.encode_properties({ident: [value] if ident in pr.REPEATABLE else value})
        raw += one[pr.decode_varint(one, 0, len(one))[1]:]  # without the block's length prefix
    block = pr.encode_varint(len(raw)) + bytes(raw)
    try:
        decoded, end = pr.decode_properties(block, 0, len(block), kind, cap)
    except MqttProtocolError as exc:
        assert exc.reason_code in (rc.QUOTA_EXCEEDED, rc.PROTOCOL_ERROR, rc.MALFORMED_PACKET)
        if exc.reason_code == rc.QUOTA_EXCEEDED:
            assert any(sum(1 for i, _ in entries if i == ident) > cap for ident in pr.REPEATABLE)
        return
    assert end == len(block)
    for ident in pr.REPEATABLE:
        assert len(decoded.get(ident, ())) == sum(1 for i, _ in entries if i == ident) <= cap


# -- topic filters per packet and per client ----------------------------------------------------------------

#: 100,000 one-character filters in one SUBSCRIBE (a 0.7 MB packet; before: 4 s of one loop turn).
MANY_FILTERS = [pk.SubscribeRequest(f"{i % 10}", 0) for i in range(100_000)]


@pytest.mark.parametrize("level", LEVELS, ids=["mqtt311", "mqtt5"])
@pytest.mark.parametrize("kind", ["subscribe", "unsubscribe"])
def test_a_packet_of_100000_topic_filters_is_refused_after_the_256th_at_once(pair: BrokerPair, level: int, kind: str) -> None:
    client = pair.client(level)
    client.connect("many")
    packet: pk.Packet = (pk.Subscribe(1, MANY_FILTERS) if kind == "subscribe"
                         else pk.Unsubscribe(1, [r.topic_filter for r in MANY_FILTERS]))
    wire = encode(packet, level)
    started = time.thread_time()
    client.send(wire)
    assert time.thread_time() - started < 0.1  # a quarter of a per-filter cost paid 100,000 times
    assert client.closed and pair.broker.tree.count_of("many") == 0
    if level == pk.MQTT_5:
        assert client.expect(pk.Disconnect).reason_code == rc.QUOTA_EXCEEDED


@pytest.mark.parametrize("level", LEVELS, ids=["mqtt311", "mqtt5"])
def test_a_client_holds_at_most_10000_subscriptions_and_may_still_replace_one(pair: BrokerPair, level: int) -> None:
    client = pair.client(level)
    client.connect("greedy")
    for packet_id, start in enumerate(range(0, MAX_SUBSCRIPTIONS_PER_CLIENT, 250), start=1):
        client.send(pk.Subscribe(packet_id, [pk.SubscribeRequest(f"g/{n}", 0) for n in range(start, start + 250)]))
        assert client.expect(pk.Suback).reason_codes == [0] * 250
    client.send(pk.Subscribe(1000, [pk.SubscribeRequest("g/one-more", 1), pk.SubscribeRequest("g/7", 1)]))
    refused = rc.QUOTA_EXCEEDED if level == pk.MQTT_5 else 0x80
    assert client.expect(pk.Suback).reason_codes == [refused, 1]  # a new filter refused, a held one replaced
    assert pair.broker.tree.count_of("greedy") == MAX_SUBSCRIPTIONS_PER_CLIENT
    client.send(pk.Unsubscribe(1001, ["g/0"]))
    client.expect(pk.Unsuback)
    client.send(pk.Subscribe(1002, [pk.SubscribeRequest("g/one-more", 0)]))
    assert client.expect(pk.Suback).reason_codes == [0]  # room again once one is gone
