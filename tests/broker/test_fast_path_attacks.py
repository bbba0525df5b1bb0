"""The broker's fast paths (``short_path``: ``ShortPath.take`` and ``ShortPath.lone_puback``) attacked
from outside, as a hostile device, a slow one and an operator would: what each attack found and what held
is written up in docs/broker.md, "The short path under attack". The differential test
(``tests/broker/test_short_path.py``) holds the short path to the general one; these hold both to what
the MQTT spec and the issue 30 guarantees say, on the fake clock (``tests/broker/pair.py``) or on real
sockets (``testing.inprocess``)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.api import ACCEPTED, BrokerHandle, InboundPublish, PublishVerdict
from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.writer import encode
from appliance.broker.routing.router import QUEUE_HIGH_WATER
from appliance.broker.security.acl import Acl
from appliance.broker.sessions.backpressure import SLOW_CONSUMER_GRACE
from appliance.broker.short_path import ROUTE_CACHE_BYTES, RouteEntry
from testing.campaigns import campaign
from testing.inprocess import InProcessBroker
from tests.broker.clients import RawClient
from tests.broker.pair import BrokerPair, FakeClient, closed_after_one_and_a_half_keep_alives
from tests.broker.versions import LEVELS, durable


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[BrokerPair]:
    pair = BrokerPair(tmp_path)
    yield pair
    pair.stop()


def publishes(packets: list[pk.Packet]) -> list[pk.Publish]:
    return [p for p in packets if isinstance(p, pk.Publish)]


# -- keep-alive ----------------------------------------------------------------------------------------


def hold_back_by_a_slow_subscriber(pair: BrokerPair, level: int) -> tuple[FakeClient, FakeClient]:
    """``pub`` (keep-alive 10 s) has published plain QoS 1 messages (the short path's) past what the
    subscriber ``sub`` queues before the broker stops reading ``pub`` (``router.QUEUE_HIGH_WATER``)."""
    subscriber = pair.connected("sub", level, properties={pr.RECEIVE_MAXIMUM: 10} if level == pk.MQTT_5 else {})
    subscriber.subscribe("t", 1)
    publisher = pair.connected("pub", level, keep_alive=10)
    for start in range(1, QUEUE_HIGH_WATER + 200, 100):
        publisher.send(*[pk.Publish("t", b"m", qos=1, packet_id=i) for i in range(start, start + 100)])
    assert "backpressure" in publisher.holds
    return subscriber, publisher


@pytest.mark.parametrize("level", LEVELS)
def test_a_publisher_the_broker_does_not_read_is_not_closed_for_keep_alive(pair: BrokerPair, level: int) -> None:
    """A publisher held back for a subscriber that is slow but makes progress (``backpressure``: held as
    long as the subscriber acknowledges something every ``SLOW_CONSUMER_GRACE``) is not read, so its
    PINGREQs wait unread in the socket: the broker must not call that silence. Its keep-alive counts
    again from the moment the broker reads it again."""
    subscriber, publisher = hold_back_by_a_slow_subscriber(pair, level)
    publisher.unread = True  # its PINGREQs, in the socket the broker does not read
    for _ in range(20):  # 30 s, two keep-alive periods of the publisher
        pair.advance(SLOW_CONSUMER_GRACE * 0.75)
        subscriber.send(pk.PubAck(next(iter(pair.broker.sessions["sub"].inflight))))  # the oldest in flight
        assert "backpressure" in publisher.holds
        assert not publisher.closed, "closed for a keep-alive the broker itself kept from being read"
    # The subscriber catches up: the publisher is read again (its last PINGREQ) and, silent from then on,
    # closed after one and a half keep-alives.
    inflight = pair.broker.sessions["sub"].inflight
    while inflight:
        subscriber.send(*[pk.PubAck(packet_id) for packet_id in list(inflight)])
    assert "backpressure" not in publisher.holds
    publisher.unread = False
    publisher.send(pk.PingReq())
    publisher.received()
    closed_after_one_and_a_half_keep_alives(pair, publisher, 10, level)


@pytest.mark.slow
def test_a_held_back_publisher_stays_connected_on_real_sockets() -> None:
    """The attack as found, on real sockets: a publisher (keep-alive 2 s, a PINGREQ every second) is held
    back by a subscriber that acknowledges one message a second; before the fix the broker closed the
    publisher at 3 s with 0x8D. Six seconds, three keep-alive periods."""
    with InProcessBroker(None) as hosted:
        subscriber = RawClient(hosted.port, pk.MQTT_5)
        subscriber.connect("slow", keep_alive=0, properties={pr.RECEIVE_MAXIMUM: 10})
        subscriber.subscribe("t", 1)
        publisher = RawClient(hosted.port, pk.MQTT_5)
        publisher.connect("pub", keep_alive=2)
        publisher.sock.sendall(b"".join(encode(pk.Publish("t", b"m", 1, packet_id=i), pk.MQTT_5)
                                        for i in range(1, QUEUE_HIGH_WATER + 300)))
        try:
            for _ in range(6):
                delivery = subscriber.expect(pk.Publish)
                publisher.send(pk.PingReq())
                time.sleep(1.0)  # the pace of a slow subscriber is the test's subject, not a synchronisation
                subscriber.send(pk.PubAck(delivery.packet_id or 0))
            publisher.sock.settimeout(0.5)
            received = b""
            with contextlib.suppress(TimeoutError):
                while chunk := publisher.sock.recv(1 << 20):
                    received += chunk
            assert b"keep alive timeout" not in received
            publisher.send(pk.PingReq())  # still open: no reset
        finally:
            subscriber.close()
            publisher.close()


class SlowService:
    """A service whose ``on_publish`` for ``svc/#`` waits until the test releases it (a store write stalled
    on a busy disk): the publisher's later packets wait in its backlog, its socket not read."""

    topic_filters = ("svc/#",)

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def start(self, broker: BrokerHandle) -> None:
        pass

    async def on_publish(self, message: InboundPublish) -> PublishVerdict:
        await self.release.wait()
        return ACCEPTED

    def on_client_disconnected(self, client_id: str) -> None:
        pass

    def reload(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def test_a_publisher_waiting_for_a_service_is_not_closed_for_keep_alive(tmp_path: Path) -> None:
    """While a service's ``on_publish`` is awaited the publisher is not read (its backlog keeps the
    order), so its PINGREQs wait unread: not its silence either. Keep-alive 1 s (closed at 1.5 s before
    the fix), the service answers after 2.5 s, a PINGREQ every half second meanwhile."""
    service = SlowService()
    with InProcessBroker(tmp_path, [service]) as hosted:
        publisher = RawClient(hosted.port, pk.MQTT_5)
        try:
            publisher.connect("pub", keep_alive=1)
            publisher.send(pk.Publish("svc/x", b"m", 1, packet_id=1))
            for _ in range(5):
                time.sleep(0.5)  # the client's own pace (its PINGREQs), not a synchronisation
                publisher.send(pk.PingReq())
            hosted.loop.call_soon_threadsafe(service.release.set)
            assert publisher.expect(pk.PubAck).packet_id == 1
            assert isinstance(publisher.expect(pk.PingResp), pk.PingResp)  # then the PINGREQs, read at last
        finally:
            publisher.close()


@pytest.mark.parametrize("left", [False, True])
def test_a_held_back_publisher_that_sends_nothing_is_closed_at_its_keep_alive(pair: BrokerPair, left: bool) -> None:
    """Held back and silent (nothing waits unread: it sent nothing, or only its FIN): closed at its
    keep-alive as any silent client, not kept for as long as the hold lasts."""
    subscriber, publisher = hold_back_by_a_slow_subscriber(pair, pk.MQTT_5)
    publisher.left_unnoticed = left
    for _ in range(10):  # 15 s
        pair.advance(SLOW_CONSUMER_GRACE * 0.75)
        subscriber.send(pk.PubAck(next(iter(pair.broker.sessions["sub"].inflight))))
    assert publisher.closed


@pytest.mark.parametrize("level", LEVELS)
def test_a_congested_subscriber_that_sends_is_not_closed_for_keep_alive_one_that_does_not_is(
        pair: BrokerPair, level: int) -> None:
    """A subscriber whose socket is congested (its write buffer over ``outbound_buffer_bytes``) is not read
    until it drains. On a slow link it still sends (its PUBACKs and PINGREQs wait unread): not silent, not
    closed. One that neither reads nor sends (a hostile device, a stuck one) is closed at its keep-alive,
    as mosquitto closes it."""
    slow = pair.connected("slow", level, keep_alive=10)
    slow.subscribe("t", 1)
    stuck = pair.connected("stuck", level, keep_alive=10)
    stuck.subscribe("t", 1)
    slow.congest(True)
    stuck.congest(True)
    slow.unread = True
    pair.advance(15.1)
    assert stuck.closed and not slow.closed
    pair.advance(30)
    assert not slow.closed
    slow.unread = False
    slow.congest(False)
    slow.send(pk.PingReq())  # what waited, read once it drained
    pair.advance(14.9)
    assert not slow.closed
    pair.advance(0.2)
    assert slow.closed


@pytest.mark.parametrize("level", LEVELS)
def test_short_path_traffic_keeps_a_connection_alive_and_silence_does_not(pair: BrokerPair, level: int) -> None:
    """A publisher that only sends plain QoS 0/1 PUBLISHes and a subscriber that only sends PUBACKs
    (``ShortPath.take`` and ``ShortPath.lone_puback``, which never build a packet object) are alive as
    long as they send; each is closed 1.5 keep-alives after its last packet."""
    subscriber = pair.connected("sub", level, keep_alive=10)
    subscriber.subscribe("t", 1)
    publisher = pair.connected("pub", level, keep_alive=10)
    for packet_id in range(1, 6):  # 45 s, three keep-alive periods of each
        pair.advance(4.5)
        publisher.send(pk.Publish("t", b"0", qos=0), pk.Publish("t", b"1", qos=1, packet_id=packet_id))
        assert publisher.expect(pk.PubAck).packet_id == packet_id
        [at_most_once, at_least_once] = publishes(subscriber.received())
        pair.advance(4.5)
        subscriber.send(pk.PubAck(at_least_once.packet_id or 0))  # a lone PUBACK read
        assert not pair.broker.sessions["sub"].inflight
        assert not publisher.closed and not subscriber.closed
    pair.advance(15.1)
    assert publisher.closed and subscriber.closed


# -- what was dropped ------------------------------------------------------------------------------------


def dropped_total(pair: BrokerPair) -> float:
    [family] = [f for f in pair.broker.metrics() if f.name == "appliance_broker_messages_dropped_total"]
    return family.samples[0][1]


@pytest.mark.parametrize("level", LEVELS)
def test_drops_stay_counted_after_the_session_that_lost_them_ends(pair: BrokerPair, level: int) -> None:
    """A stuck subscriber (a slow consumer: its QoS 0 messages are dropped) that then leaves: the drops
    it caused stay in the counter (a Prometheus counter never goes down), or the drops a hostile client
    made would vanish from the figures with it."""
    subscriber = pair.connected("stuck", level)
    subscriber.subscribe("t", 0)
    publisher = pair.connected("pub", level)
    subscriber.congest(True)
    publisher.send(pk.Publish("t", b"held"))
    pair.advance(SLOW_CONSUMER_GRACE + 0.1)  # a slow consumer from now on
    publisher.send(*[pk.Publish("t", b"dropped") for _ in range(5)])
    assert dropped_total(pair) == 5
    subscriber.drop()  # a session without expiry: it ends here
    assert "stuck" not in pair.broker.sessions
    assert dropped_total(pair) == 5
    again = pair.connected("stuck", level)  # a new session of the same client id counts on from there
    again.subscribe("t", 0)
    again.congest(True)
    publisher.send(pk.Publish("t", b"held"))
    pair.advance(SLOW_CONSUMER_GRACE + 0.1)
    publisher.send(pk.Publish("t", b"dropped"))
    assert dropped_total(pair) == 6


# -- commit before acknowledgement ---------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_a_message_acknowledged_beside_a_durable_subscriber_survives_kill_9(tmp_path: Path, level: int) -> None:
    """A durable subscriber online beside one the short path could serve: every PUBLISH the publisher got
    its PUBACK for is in ``broker.db``, so after a kill -9 (``BrokerPair.killed``) it reaches the durable
    session (with DUP: it was sent before the cut), in order, each once."""
    pair = BrokerPair(tmp_path)
    keeper = pair.connected("keeper", level, **durable(level, 600))
    keeper.subscribe("t", 1)
    plain = pair.connected("plain", level)
    plain.subscribe("t", 1)
    publisher = pair.connected("pub", level)
    for packet_id in range(1, 6):
        publisher.send(pk.Publish("t", str(packet_id).encode(), qos=1, packet_id=packet_id))
        assert publisher.expect(pk.PubAck).packet_id == packet_id
    assert [p.payload for p in publishes(keeper.received())] == [b"1", b"2", b"3", b"4", b"5"]  # never acknowledged
    restarted = pair.killed(1.0)
    try:
        again = restarted.client(level)
        again.send(pk.Connect(level, "keeper", **durable(level, 600)))
        [connack, *redelivered] = again.received()
        assert isinstance(connack, pk.Connack) and connack.session_present
        assert [(p.payload, p.dup) for p in publishes(redelivered)] == [(str(i).encode(), True) for i in range(1, 6)]
    finally:
        restarted.stop()


# -- bounded memory --------------------------------------------------------------------------------------


def held_by(routes: dict[bytes, RouteEntry]) -> int:
    """The bytes the route cache's own objects take (``sys.getsizeof``: the dict, its keys, each entry,
    its topic name, its targets tuple and each target's tuple; not the sessions they name)."""
    held = sys.getsizeof(routes)
    for key, entry in routes.items():
        held += sys.getsizeof(key) + sys.getsizeof(entry) + sys.getsizeof(entry.topic)
        if entry.targets is not None:
            held += sys.getsizeof(entry.targets) + sum(sys.getsizeof(target) for target in entry.targets)
    return held


def test_the_route_cache_stays_in_its_byte_budget_with_many_subscribers() -> None:
    """A publisher that sends each message to a new topic (one per read: the short path caches each)
    while many sessions subscribe to ``#``: a cached route keeps each of its topic's subscribers, so the
    cache grew with topics times subscribers; it must stay within ``ROUTE_CACHE_BYTES``. The subscribers
    may no longer read what is published (an ACL reload after they subscribed), so the messages cost no
    deliveries and the test stays fast; the route cache is filled all the same."""
    subscribers = 100
    topics = 3000  # without the budget: 3,000 routes of 100 targets of 72 bytes, 21.6 MB
    pair = BrokerPair()
    try:
        for index in range(subscribers):
            pair.connected(f"s{index}").subscribe("#")
        publisher = pair.connected("pub")
        pair.broker.reload_security(pair.broker.authenticator, Acl.parse("topic write #\ntopic read other/#\n"))
        routes = pair.broker.short_path.routes  # type: ignore[union-attr]
        peak = 0
        for index in range(topics):
            publisher.send(pk.Publish(f"dev/{index:05d}/t", b"1"))
            if index % 100 == 99:
                peak = max(peak, held_by(routes))
    finally:
        pair.stop()
    assert routes, "the short path took none of it"
    assert peak <= ROUTE_CACHE_BYTES, f"{peak / 1e6:.1f} MB held after {topics} topics"


# -- $SYS ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("retain", [False, True])
def test_a_client_cannot_write_the_brokers_sys_topics(pair: BrokerPair, level: int, retain: bool) -> None:
    """``$SYS`` is the broker's own report (its counters, what it dropped): a device that publishes
    ``$SYS/broker/publish/messages/dropped = 0`` must not reach a monitor, nor replace the retained value.
    As mosquitto (``acl__check_dollar``, with or without an ACL file): a client's PUBLISH to ``$SYS...``
    or ``$share...`` is not authorized (MQTT 5: 0x87; 3.1.1, which cannot say no: acknowledged, dropped),
    except a bridge's status topic ``$SYS/broker/connection/+/state``. Plain QoS 0 and 1 are what the
    short path takes, retained ones the general path."""
    monitor = pair.connected("monitor", level)
    monitor.subscribe("$SYS/#", 1)
    device = pair.connected("device", level)
    for packet_id, topic in enumerate(("$SYS/broker/publish/messages/dropped", "$SYSTEM/x", "$share/g/t"), 1):
        device.send(pk.Publish(topic, b"0", qos=1, retain=retain, packet_id=packet_id),
                    pk.Publish(topic, b"0", qos=0, retain=retain))
        assert device.expect(pk.PubAck).reason_code == (rc.NOT_AUTHORIZED if level == pk.MQTT_5 else rc.SUCCESS)
    assert publishes(monitor.received()) == []
    assert len(pair.broker.retained) == 0
    bridge_state = "$SYS/broker/connection/cloud/state"
    device.send(pk.Publish(bridge_state, b"1", qos=1, retain=retain, packet_id=9))
    assert device.expect(pk.PubAck).reason_code == rc.SUCCESS
    assert [p.topic for p in publishes(monitor.received())] == [bridge_state]


@pytest.mark.parametrize("level", LEVELS)
def test_a_will_cannot_write_the_brokers_sys_topics(pair: BrokerPair, level: int) -> None:
    monitor = pair.connected("monitor", level)
    monitor.subscribe("$SYS/#", 1)
    device = pair.connected("device", level, will=pk.Will("$SYS/broker/clients/connected", b"0", 1, True))
    device.drop()
    assert publishes(monitor.received()) == [] and len(pair.broker.retained) == 0


# -- hostile acknowledgements ------------------------------------------------------------------------------


def ack_fragment(kind: str, packet_id: int, reason: int) -> bytes:
    """One acknowledgement-like piece of a hostile read (whole, cut short or malformed)."""
    ident = packet_id.to_bytes(2, "big")
    return {
        "puback": b"\x40\x02" + ident,
        "puback-reason": b"\x40\x03" + ident + bytes([reason]),
        "puback-properties": b"\x40\x04" + ident + bytes([reason]) + b"\x00",
        "puback-flags": b"\x41\x02" + ident,
        "puback-short": b"\x40\x01" + ident[:1],
        "puback-empty": b"\x40\x00",
        "puback-long-length": b"\x40\x82\x00" + ident,
        "pubrec": b"\x50\x02" + ident,
        "pubcomp": b"\x70\x02" + ident,
        "pingreq": b"\xc0\x00",
    }[kind]


FRAGMENTS = st.lists(
    st.tuples(st.sampled_from(["puback"] * 6 + ["puback-reason", "puback-properties", "puback-flags", "puback-short",
                                                "puback-empty", "puback-long-length", "pubrec", "pubcomp", "pingreq"]),
              st.sampled_from([1, 2, 3, 4, 0, 9, 65535]), st.sampled_from([0x00, 0x10, 0x80, 0x97])),
    min_size=1, max_size=8)


@campaign(120, deadline=None)
@given(level=st.sampled_from([pk.MQTT_311, pk.MQTT_5]), qos=st.sampled_from([1, 1, 2]), fragments=FRAGMENTS,
       cuts=st.lists(st.integers(1, 40), max_size=6))
def test_hostile_acknowledgements_get_what_the_general_path_gives(level: int, qos: int,
                                                                   fragments: list[tuple[str, int, int]],
                                                                   cuts: list[int]) -> None:
    """A subscriber with four deliveries in flight sends acknowledgements of ids never sent, already
    acknowledged, of the other QoS, long forms with reason codes, reserved flags, half packets and
    PINGREQs, cut into reads anywhere (4-byte reads among them: ``ShortPath.lone_puback``). The broker
    with the short path must answer byte for byte as the one without (a protocol error closes that
    client only, MQTT 5 with its reason code), leave the same deliveries in flight, and still serve
    the others (a sentinel published afterwards reaches a second subscriber)."""
    data = b"".join(ack_fragment(kind, packet_id, reason) for kind, packet_id, reason in fragments)
    reads: list[bytes] = []
    start = 0
    for cut in cuts:
        if start + cut < len(data):
            reads.append(data[start : start + cut])
            start += cut
    reads.append(data[start:])
    seen = []
    for short in (True, False):
        pair = BrokerPair()
        if not short:
            pair.broker.short_path = None
        try:
            hostile = pair.connected("hostile", level)
            hostile.subscribe("t", qos)
            other = pair.connected("other", level)
            other.subscribe("t", 1)
            publisher = pair.connected("pub", level)
            for packet_id in range(1, 5):
                publisher.send(pk.Publish("t", b"m", qos, packet_id=packet_id))
            for read in reads:
                if hostile.closed:
                    break
                hostile.send(read)
            publisher.send(pk.Publish("t", b"sentinel", 1, packet_id=9))
            assert publishes(other.received())[-1].payload == b"sentinel"
            session = pair.broker.sessions.get("hostile")
            seen.append((bytes(hostile.raw), hostile.closed, bytes(publisher.raw), bytes(other.raw),
                         None if session is None else (sorted(session.inflight), session.completed, len(session.queue))))
        finally:
            pair.stop()
    assert seen[0] == seen[1]
