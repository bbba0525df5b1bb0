"""Large retained sets reach a new subscription a slice per loop turn (issue 12, item 7), on the fake clock
(``tests/broker/pair.py``), stepping the loop one iteration at a time (``FakeRuntime.step``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.broker.codec import packets as pk
from appliance.broker.routing.message import BrokerMessage
from appliance.broker.routing.retained_feed import DELIVERY_COST, TURN_BUDGET
from appliance.broker.routing.router import QUEUE_HIGH_WATER
from testing.campaigns import campaign
from tests.broker.pair import BrokerPair, FakeClient
from tests.broker.test_timing import LEVELS, durable, publishes

RETAINED = 20_000
#: The most retained messages one loop iteration may hand over: a turn's budget, once from the SUBSCRIBE
#: handling and once from the scheduled turn.
PER_ITERATION = 2 * TURN_BUDGET // DELIVERY_COST


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[BrokerPair]:
    pair = BrokerPair(tmp_path)
    yield pair
    pair.stop()


def retain(pair: BrokerPair, count: int, prefix: str = "r") -> None:
    """``count`` retained QoS 1 messages on ``{prefix}/{i}``, retained in that order."""
    for index in range(count):
        pair.broker.retained.update(BrokerMessage(f"{prefix}/{index}", f"old {index}".encode(), 1, True, {}, None, None))


def acknowledge(client: FakeClient, packets: list[pk.Packet]) -> list[pk.Publish]:
    """PUBACK every QoS 1 PUBLISH among ``packets`` (in one read); returns the PUBLISHes."""
    received = publishes(packets)
    acks = [pk.PubAck(p.packet_id) for p in received if p.qos == 1 and p.packet_id is not None]
    if acks:
        client.send(*acks)
    return received


@pytest.mark.parametrize("level", LEVELS)
def test_a_large_retained_set_leaves_in_slices_and_other_clients_are_served_meanwhile(
    pair: BrokerPair, level: int
) -> None:
    retain(pair, RETAINED)
    subscriber = pair.client(level)
    subscriber.connect("subscriber", **durable(level))  # type: ignore[arg-type]
    pinger = pair.client(level)
    pinger.connect("pinger")
    session = pair.broker.sessions["subscriber"]
    runtime = pair.runtime

    subscriber.arrive(pk.Subscribe(1, [pk.SubscribeRequest("r/#", 1)]))
    runtime.step()
    assert isinstance(subscriber.inbox[0], pk.Suback)
    # Finding 20,000 matches takes a few iterations, then each hands over at most a slice.
    handed_over = 0
    for _iteration in range(1, 10):
        now_handed_over = len(session.inflight) + len(session.queue)
        assert now_handed_over - handed_over <= PER_ITERATION  # before: all 20,000 in the first
        handed_over = now_handed_over
        runtime.step()
    assert 0 < handed_over < RETAINED
    assert len(pair.broker.retained_feeds) == 1

    # The subscriber reads nothing yet: the feed stops at the queue's high-water mark instead of
    # queueing everything in memory, and the broker keeps serving the pinger.
    for _ in range(20):
        pinger.arrive(pk.PingReq())
        runtime.step()
        assert isinstance(pinger.expect(pk.PingResp), pk.PingResp)
        assert len(session.queue) <= QUEUE_HIGH_WATER + PER_ITERATION
    assert len(pair.broker.retained_feeds) == 1

    # Acknowledging drains it: every retained message arrives once, oldest topic first.
    topics: list[str] = []
    rounds = 0
    while len(topics) < RETAINED:
        rounds += 1
        assert rounds < 10 * RETAINED, "the feed stopped"
        received = acknowledge(subscriber, subscriber.received())
        topics += [p.topic for p in received]
        if not received:
            pair.advance(0.05)
    assert topics == [f"r/{i}" for i in range(RETAINED)]
    assert len(pair.broker.retained_feeds) == 0 and pair.broker.router.live_topics == {}


def test_a_live_message_is_never_followed_by_the_older_retained_one(pair: BrokerPair) -> None:
    retain(pair, RETAINED)
    publisher = pair.client(pk.MQTT_5)
    publisher.connect("publisher")
    subscriber = pair.client(pk.MQTT_5)
    subscriber.connect("subscriber")
    subscriber.arrive(pk.Subscribe(1, [pk.SubscribeRequest("r/#", 0)]))
    for _ in range(4):
        pair.runtime.step()  # the feed has begun: r/7 is among the first handed over, r/19999 the last
    last = f"r/{RETAINED - 1}"
    publisher.arrive(pk.Publish(last, b"new, live", 0), pk.Publish("r/7", b"new, retained", 0, retain=True))
    pair.runtime.run()
    values: dict[str, list[bytes]] = {}
    for message in publishes(subscriber.received()):
        values.setdefault(message.topic, []).append(message.payload)
    assert values[last] == [b"new, live"]  # not followed by "old 19999"
    assert values["r/7"] == [b"old 7", b"new, retained"]  # already fed before the live one: in order
    assert len(values) == RETAINED


@pytest.mark.parametrize("level", LEVELS)
def test_an_unsubscribe_or_a_new_session_ends_the_feed(pair: BrokerPair, level: int) -> None:
    retain(pair, RETAINED)
    subscriber = pair.client(level)
    subscriber.connect("subscriber")
    subscriber.arrive(pk.Subscribe(1, [pk.SubscribeRequest("r/#", 0)]))
    for _ in range(4):
        pair.runtime.step()
    subscriber.arrive(pk.Unsubscribe(2, ["r/#"]))
    pair.runtime.run()
    count = len(publishes(subscriber.received()))
    assert 0 < count < RETAINED
    assert len(pair.broker.retained_feeds) == 0

    subscriber.arrive(pk.Subscribe(3, [pk.SubscribeRequest("r/#", 0)]))
    pair.runtime.step()
    subscriber.drop()  # clean session: the session ends with the connection
    assert len(pair.broker.retained_feeds) <= 1
    pair.advance(1.0)
    assert len(pair.broker.retained_feeds) == 0 and pair.broker.router.live_topics == {}


FILTERS = st.sampled_from(["#", "r/#", "r/+", "+/+", "r/1", "s/#", "$SYS/#", "r/+/x"])


@campaign(40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(0, 1200), filters=st.lists(FILTERS, min_size=1, max_size=4),
       unsubscribe=st.lists(FILTERS, max_size=2), steps=st.integers(0, 5))
def test_feeds_deliver_exactly_what_matching_returns(
    tmp_path: Path, count: int, filters: list[str], unsubscribe: list[str], steps: int
) -> None:
    """Whatever the filters, their order and interleaved UNSUBSCRIBEs: each feed that runs to its end
    delivers exactly ``RetainedMessages.matching`` in its order, a slice per iteration at most, and
    nothing is left behind (no feed, no live-topic record)."""
    pair = BrokerPair(tmp_path / "broker", max_inflight_messages=0)
    try:
        retain(pair, count)
        now = pair.runtime.now()
        expected = [m.topic for f in filters if f not in unsubscribe for m in pair.broker.retained.matching(f, now)]
        subscriber = pair.client(pk.MQTT_5)
        subscriber.connect("subscriber")
        subscriber.arrive(pk.Subscribe(1, [pk.SubscribeRequest(f, 0) for f in filters]))
        for _ in range(steps):
            pair.runtime.step()
            assert len(publishes(subscriber.inbox)) <= (steps + 1) * PER_ITERATION
        if unsubscribe:
            subscriber.arrive(pk.Unsubscribe(2, unsubscribe))
        pair.runtime.run()
        received = [p.topic for p in publishes(subscriber.received())]
        if not unsubscribe:
            assert received == expected
        else:
            assert set(expected) <= set(received)
        assert len(pair.broker.retained_feeds) == 0 and pair.broker.router.live_topics == {}
    finally:
        pair.stop()
