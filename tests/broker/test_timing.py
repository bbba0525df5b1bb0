"""Time-based broker behaviour on the fake clock (``tests/broker/pair.py``): will delay, session expiry,
message expiry, keep-alive, flapping and slow consumers, each under MQTT 3.1.1 and 5 where both have it. No sockets,
no waiting: the clock moves when the test says so."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.handlers.connect import FLAP_FREE_TAKEOVERS
from appliance.broker.routing.router import QUEUE_HIGH_WATER
from appliance.broker.security.auth import Authenticator, hash_password
from appliance.broker.sessions.backpressure import SLOW_CONSUMER_GRACE
from tests.broker.pair import BrokerPair, FakeClient, closed_after_one_and_a_half_keep_alives, subscriber_and_publisher
from tests.broker.versions import LEVELS, durable


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[BrokerPair]:
    pair = BrokerPair(tmp_path, max_session_expiry=60)
    yield pair
    pair.stop()


def publishes(packets: list[pk.Packet]) -> list[pk.Publish]:
    return [p for p in packets if isinstance(p, pk.Publish)]


def will_watcher(pair: BrokerPair, level: int = pk.MQTT_5) -> FakeClient:
    """A client subscribed to every will (``wills/#``)."""
    watcher = pair.client(level)
    watcher.connect("watcher")
    watcher.subscribe("wills/#")
    return watcher


def leave_a_durable_subscription(pair: BrokerPair, level: int) -> None:
    """``sub`` subscribes to ``t`` at QoS 1 in a session that outlives its connection by 60 s, and goes away."""
    subscriber = pair.client(level)
    subscriber.connect("sub", **durable(level, 60))
    subscriber.subscribe("t", 1)
    subscriber.drop()


def publish_past_the_high_water(publisher: FakeClient) -> None:
    """QoS 1 messages on ``t``, 200 more than a subscriber's queue holds before it holds its publisher."""
    for start in range(1, QUEUE_HIGH_WATER + 200, 100):
        publisher.send(*[pk.Publish("t", b"m", qos=1, packet_id=i) for i in range(start, start + 100)])


# -- wills ---------------------------------------------------------------------------------------------


def test_a_delayed_will_goes_out_when_its_delay_is_over_not_before(pair: BrokerPair) -> None:
    """MQTT 5 only: the Will Delay Interval is a will property (3.1.1's will goes out at once)."""
    watcher = will_watcher(pair)
    client = pair.client()
    will = pk.Will("wills/a", b"gone", properties={pr.WILL_DELAY_INTERVAL: 30})
    client.connect("a", will=will, properties={pr.SESSION_EXPIRY_INTERVAL: 60})
    client.drop()
    pair.advance(29.5)
    assert publishes(watcher.received()) == []
    pair.advance(1.0)
    [message] = publishes(watcher.received())
    assert (message.topic, message.payload) == ("wills/a", b"gone")


def test_reconnecting_within_the_will_delay_cancels_the_will(pair: BrokerPair) -> None:
    """MQTT 5 only: the Will Delay Interval is a will property (3.1.1's will goes out at once)."""
    watcher = will_watcher(pair)
    will = pk.Will("wills/a", b"gone", properties={pr.WILL_DELAY_INTERVAL: 30})
    first = pair.client()
    first.connect("a", will=will, properties={pr.SESSION_EXPIRY_INTERVAL: 60})
    first.drop()
    pair.advance(10)
    pair.client().connect("a", clean_start=False, properties={pr.SESSION_EXPIRY_INTERVAL: 60})
    pair.advance(60)
    assert publishes(watcher.received()) == []


@pytest.mark.parametrize("level", LEVELS)
def test_a_will_without_delay_goes_out_at_once_when_the_connection_breaks(pair: BrokerPair, level: int) -> None:
    watcher = will_watcher(pair, level)
    client = pair.client(level)
    client.connect("a", will=pk.Will("wills/a", b"gone"))
    client.drop()
    [message] = publishes(watcher.received())
    assert message.payload == b"gone"


def test_a_session_ending_before_the_will_delay_publishes_the_will_then(pair: BrokerPair) -> None:
    """MQTT 5 3.1.3.2.2: the will goes out at the earlier of its delay and the session's end. MQTT 5 only:
    3.1.1 has neither a will delay nor a session expiry of its own."""
    watcher = will_watcher(pair)
    client = pair.client()
    client.connect("a", will=pk.Will("wills/a", b"gone", properties={pr.WILL_DELAY_INTERVAL: 300}),
                   properties={pr.SESSION_EXPIRY_INTERVAL: 20})
    client.drop()
    pair.advance(19)
    assert publishes(watcher.received()) == []
    pair.advance(2)
    assert [m.payload for m in publishes(watcher.received())] == [b"gone"]


@pytest.mark.parametrize("comes_back", [False, True], ids=["stays-away", "comes-back"])
def test_a_delayed_will_pending_at_a_crash_keeps_its_moment_or_is_cancelled_by_a_return(
    tmp_path: Path, comes_back: bool
) -> None:
    """MQTT 5 only (the Will Delay Interval). The broker is killed while a will waits out its delay and
    restarts 10 s later: the will goes out when its delay ends counted from the disconnect (not from the
    restart, not at once), unless the client is back first. The real kill -9 of the first case is
    test_interop_durability.py's; this one adds the return and needs no real seconds."""
    pair = BrokerPair(tmp_path, max_session_expiry=3600)
    watcher = pair.client()
    watcher.connect("watcher", **durable(pk.MQTT_5, 3600))
    watcher.subscribe("wills/#", 1)
    device = pair.client()
    device.connect("a", will=pk.Will("wills/a", b"gone", properties={pr.WILL_DELAY_INTERVAL: 30}),
                   **durable(pk.MQTT_5, 600))
    device.drop()
    restarted = pair.killed(down_for=10)
    watcher = restarted.client()
    assert watcher.connect("watcher", **durable(pk.MQTT_5, 3600)).session_present
    if comes_back:
        assert restarted.client().connect("a", **durable(pk.MQTT_5, 600)).session_present
        restarted.advance(600)
        assert publishes(watcher.received()) == []
    else:
        restarted.advance(19.5)
        assert publishes(watcher.received()) == []
        restarted.advance(1.0)
        assert [(m.topic, m.payload) for m in publishes(watcher.received())] == [("wills/a", b"gone")]
    restarted.stop()


# -- session expiry ------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_an_away_session_keeps_its_messages_until_it_expires(pair: BrokerPair, level: int) -> None:
    leave_a_durable_subscription(pair, level)
    publisher = pair.client(level)
    publisher.connect("pub")
    publisher.send(pk.Publish("t", b"kept", qos=1, packet_id=1))
    pair.advance(59)
    back = pair.client(level)
    back.send(pk.Connect(level, "sub", **durable(level, 60)))  # type: ignore[arg-type]
    connack, message = back.received()
    assert isinstance(connack, pk.Connack) and connack.session_present
    assert isinstance(message, pk.Publish) and message.payload == b"kept"


@pytest.mark.parametrize("level", LEVELS)
def test_an_expired_session_is_gone(pair: BrokerPair, level: int) -> None:
    leave_a_durable_subscription(pair, level)
    pair.advance(61)
    assert "sub" not in pair.broker.sessions
    publisher = pair.client(level)
    publisher.connect("pub")
    publisher.send(pk.Publish("t", b"lost", qos=1, packet_id=1))
    back = pair.client(level)
    assert not back.connect("sub", **durable(level, 60)).session_present  # type: ignore[arg-type]
    assert back.received() == []


# -- message expiry ------------------------------------------------------------------------------------


def test_a_queued_message_expires_and_the_rest_count_down(pair: BrokerPair) -> None:
    """MQTT 5 only: the Message Expiry Interval is a PUBLISH property (3.1.1 messages never expire). A
    message queued for an away session is dropped once its lifetime has passed; one still alive goes
    out with its interval lowered by the time it waited (3.3.2.3.3)."""
    leave_a_durable_subscription(pair, pk.MQTT_5)
    publisher = pair.client()
    publisher.connect("pub")
    publisher.send(pk.Publish("t", b"short", qos=1, packet_id=1, properties={pr.MESSAGE_EXPIRY_INTERVAL: 1}),
                   pk.Publish("t", b"long", qos=1, packet_id=2, properties={pr.MESSAGE_EXPIRY_INTERVAL: 100}))
    pair.advance(2)
    back = pair.client()
    back.send(pk.Connect(pk.MQTT_5, "sub", **durable(pk.MQTT_5, 60)))
    connack, message = back.received()
    assert isinstance(connack, pk.Connack) and connack.session_present
    assert isinstance(message, pk.Publish) and message.payload == b"long"
    assert message.properties[pr.MESSAGE_EXPIRY_INTERVAL] == 98


# -- keep-alive ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_a_silent_client_is_closed_after_one_and_a_half_keep_alives(pair: BrokerPair, level: int) -> None:
    client = pair.client(level)
    client.connect("quiet", keep_alive=10)
    closed_after_one_and_a_half_keep_alives(pair, client, 10, level)


@pytest.mark.parametrize("level", LEVELS)
def test_traffic_keeps_a_connection_alive(pair: BrokerPair, level: int) -> None:
    client = pair.client(level)
    client.connect("chatty", keep_alive=10)
    for _ in range(5):
        pair.advance(9)
        client.send(pk.PingReq())
        assert isinstance(client.expect(pk.PingResp), pk.PingResp)
    assert not client.closed
    pair.advance(15.1)
    assert client.closed


# -- flapping ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_a_client_id_taken_over_too_often_is_slowed_down(pair: BrokerPair, level: int) -> None:
    clients = [pair.client(level)]
    clients[0].connect("flap")
    for _ in range(FLAP_FREE_TAKEOVERS):
        clients.append(pair.client(level))
        clients[-1].connect("flap")
    late = pair.client(level)
    late.send(pk.Connect(level, "flap"))
    assert late.received() == []  # held back for 0.25 s
    pair.advance(0.25)
    assert isinstance(late.expect(pk.Connack), pk.Connack)


# -- slow consumers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_a_congested_subscriber_holds_its_publisher_back_for_the_grace_period_only(pair: BrokerPair, level: int) -> None:
    subscriber, publisher = subscriber_and_publisher(pair, level, qos=0)
    subscriber.congest(True)
    publisher.send(pk.Publish("t", b"1"))
    assert "backpressure" in publisher.holds
    pair.advance(SLOW_CONSUMER_GRACE - 0.1)
    assert "backpressure" in publisher.holds
    pair.advance(0.2)
    assert "backpressure" not in publisher.holds
    assert subscriber.connection.overloaded
    subscriber.received()
    publisher.send(pk.Publish("t", b"2"))
    assert publishes(subscriber.received()) == []  # QoS 0 to a slow consumer: dropped and counted
    assert pair.broker.sessions["sub"].dropped == 1


@pytest.mark.parametrize("level", LEVELS)
def test_a_subscriber_that_drains_in_time_releases_its_publisher(pair: BrokerPair, level: int) -> None:
    subscriber, publisher = subscriber_and_publisher(pair, level, qos=0)
    subscriber.congest(True)
    publisher.send(pk.Publish("t", b"1"))
    pair.advance(1.0)
    subscriber.congest(False)
    assert "backpressure" not in publisher.holds and not subscriber.connection.overloaded


@pytest.mark.parametrize("level", LEVELS)
def test_a_subscriber_that_stops_acknowledging_is_a_slow_consumer_after_the_grace(pair: BrokerPair, level: int) -> None:
    subscriber, publisher = subscriber_and_publisher(pair, level, qos=1)
    publish_past_the_high_water(publisher)
    assert "backpressure" in publisher.holds
    pair.advance(SLOW_CONSUMER_GRACE + 0.1)
    assert "backpressure" not in publisher.holds
    assert subscriber.connection.overloaded


@pytest.mark.parametrize("level", LEVELS)
def test_a_slow_but_acknowledging_subscriber_keeps_its_publisher_held(pair: BrokerPair, level: int) -> None:
    subscriber, publisher = subscriber_and_publisher(pair, level, qos=1)
    publish_past_the_high_water(publisher)
    first = publishes(subscriber.received())[0]
    pair.advance(SLOW_CONSUMER_GRACE - 0.5)
    subscriber.send(pk.PubAck(first.packet_id or 0))
    pair.advance(1.0)
    assert "backpressure" in publisher.holds and not subscriber.connection.overloaded



# -- one clock reading per batch ---------------------------------------------------------------------------


def end_with_a_protocol_error(pair: BrokerPair) -> Callable[[], None]:
    client = pair.connected("a", will=pk.Will("wills/a", b"gone", properties={pr.WILL_DELAY_INTERVAL: 5}),
                            properties={pr.SESSION_EXPIRY_INTERVAL: 60})
    return lambda: client.arrive(pk.Connect(pk.MQTT_5, "a", True, 0))  # a second CONNECT: a protocol error


def end_by_a_takeover(pair: BrokerPair) -> Callable[[], None]:
    pair.connected("a", will=pk.Will("wills/a", b"gone"), properties={pr.SESSION_EXPIRY_INTERVAL: 60})
    newcomer = pair.client()
    return lambda: newcomer.arrive(pk.Connect(pk.MQTT_5, "a", False, 0, properties={pr.SESSION_EXPIRY_INTERVAL: 60}))


def connect_with_a_keep_alive(pair: BrokerPair) -> Callable[[], None]:
    client = pair.client()
    return lambda: client.arrive(pk.Connect(pk.MQTT_5, "a", True, 30))


@pytest.mark.parametrize("prepare", [end_with_a_protocol_error, end_by_a_takeover, connect_with_a_keep_alive])
def test_a_batch_reads_the_clock_once(pair: BrokerPair, prepare: Callable[[BrokerPair], Callable[[], None]]) -> None:
    """The core reads the time once per batch of packets (``context.read_clock``); every handler of the
    batch, and what it calls (closing a connection, its will, the keep-alive timer), uses that reading: a
    second read could see a later time than the one the batch was judged at."""
    batch = prepare(pair)
    reads = pair.count_clock_reads()
    batch()
    assert reads == {"now": 1, "monotonic": 1}


def test_a_password_check_goes_on_as_one_batch_with_one_reading() -> None:
    """A CONNECT whose password is hashed: the read is one batch, what follows the check another (it
    counts the success for the login gate and completes the CONNECT), one clock reading each."""
    pair = BrokerPair(authenticator=Authenticator({"alice": hash_password("alice", iterations=1000)},
                                                  allow_anonymous=False))
    try:
        client = pair.client()
        reads = pair.count_clock_reads()
        client.send(pk.Connect(pk.MQTT_5, "a", username="alice", password=b"alice"))
        assert client.expect(pk.Connack).reason_code == rc.SUCCESS
        assert reads == {"now": 2, "monotonic": 2}
    finally:
        pair.stop()
