"""The service contract (``appliance/broker/api.py``) against the real broker on a real socket.

The broker runs in-process on its own event loop thread (as the gateway runs it, with a real
``broker.db``), hosting a small service written for this test: a genuine ``BrokerService``
implementation with named behaviours per topic, in the spirit of Edge Hub's ``FailedEndpoint``.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.broker.api import ACCEPTED, BrokerHandle, InboundPublish, PublishVerdict
from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.writer import encode
from testing.inprocess import InProcessBroker
from testing.waiting import wait_until
from tests.broker.clients import RawClient


class ScriptedService:
    """``svc/echo`` answers on the response topic, ``svc/reject`` refuses with 0x97, ``svc/consume`` keeps
    the message from subscribers, ``svc/kick`` disconnects the publisher; everything is recorded."""

    topic_filters = ("svc/#",)

    def __init__(self) -> None:
        self.broker: BrokerHandle | None = None
        self.seen: list[InboundPublish] = []
        self.disconnected: list[str] = []
        self.stopped = False
        self.release = asyncio.Event()

    async def start(self, broker: BrokerHandle) -> None:
        self.broker = broker

    async def on_publish(self, message: InboundPublish) -> PublishVerdict:
        self.seen.append(message)
        if message.topic == "svc/slow":
            await self.release.wait()
        if message.topic == "svc/reject":
            return PublishVerdict(rc.QUOTA_EXCEEDED, "quota exceeded")
        if message.topic == "svc/consume":
            return PublishVerdict(route=False)
        if message.topic == "svc/kick":
            return PublishVerdict(disconnect=rc.ADMINISTRATIVE_ACTION)
        if message.topic == "svc/unstored":  # what a service whose own commit failed answers
            return PublishVerdict(rc.QUOTA_EXCEEDED, "cannot store", disconnect=rc.QUOTA_EXCEEDED)
        if message.topic == "svc/echo":
            await asyncio.sleep(0)
            assert self.broker is not None and message.response_topic is not None
            self.broker.publish(
                message.response_topic, b"echo:" + message.payload, 1,
                correlation_data=message.correlation_data, user_properties=[("status", "ok")],
                content_type="text/plain",
            )
        return ACCEPTED

    def on_client_disconnected(self, client_id: str) -> None:
        self.disconnected.append(client_id)

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def service() -> ScriptedService:
    return ScriptedService()


@pytest.fixture
def hosted(tmp_path: Path, service: ScriptedService) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, [service]) as broker:
        yield broker
    assert service.stopped


def test_request_response_through_a_service(hosted: InProcessBroker, service: ScriptedService) -> None:
    client = RawClient(hosted.port)
    client.connect("requester")
    client.subscribe("reply/requester", 1)
    client.send(pk.Publish("svc/echo", b"ping", 1, packet_id=5, properties={
        pr.RESPONSE_TOPIC: "reply/requester", pr.CORRELATION_DATA: b"\x01\x02", pr.USER_PROPERTY: [("a", "b")]}))
    got = {type(packet): packet for packet in (client.recv(), client.recv())}
    assert got[pk.PubAck].reason_code == 0
    response = got[pk.Publish]
    assert (response.topic, response.payload) == ("reply/requester", b"echo:ping")
    assert response.properties[pr.CORRELATION_DATA] == b"\x01\x02"
    assert response.properties[pr.USER_PROPERTY] == [("status", "ok")]
    assert response.properties[pr.CONTENT_TYPE] == "text/plain"
    seen = service.seen[0]
    assert (seen.client_id, seen.protocol_level, seen.qos, seen.user_properties) == ("requester", 5, 1, [("a", "b")])
    client.close()


def test_puback_waits_for_the_service_and_packets_keep_their_order(
    hosted: InProcessBroker, service: ScriptedService, level: int
) -> None:
    watcher = RawClient(hosted.port, level)
    watcher.connect("watcher")
    watcher.subscribe("#", 0)
    client = RawClient(hosted.port, level)
    client.connect("orderly")
    client.send(encode_all([pk.Publish("svc/slow", b"1", 1, packet_id=1), pk.Publish("plain/x", b"2", 1, packet_id=2)],
                           level))
    # The service holds the first message; one turn of the broker's loop later, whatever the broker
    # answered is in the client's socket: nothing is (an early PUBACK 2 would also break the order below).
    wait_until(lambda: len(service.seen) == 1, what="the service seeing the first message")
    hosted.call(asyncio.sleep(0))
    client.sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        client.sock.recv(1, socket.MSG_PEEK)
    hosted.loop.call_soon_threadsafe(service.release.set)
    assert [client.expect(pk.PubAck).packet_id, client.expect(pk.PubAck).packet_id] == [1, 2]
    assert [watcher.expect(pk.Publish).payload, watcher.expect(pk.Publish).payload] == [b"1", b"2"]
    client.close()
    watcher.close()


def test_service_verdicts_reach_the_publisher(hosted: InProcessBroker) -> None:
    watcher = RawClient(hosted.port)
    watcher.connect("watcher")
    watcher.subscribe("svc/#", 0)
    for level in (5, 4):
        client = RawClient(hosted.port, level)
        client.connect(f"verdicts-{level}")
        client.send(pk.Publish("svc/reject", b"x", 1, packet_id=1))
        ack = client.expect(pk.PubAck)
        assert ack.reason_code == (rc.QUOTA_EXCEEDED if level == 5 else 0)
        if level == 5:
            assert ack.properties[pr.REASON_STRING] == "quota exceeded"
        client.send(pk.Publish("svc/consume", b"kept by the service", 1, packet_id=2))
        assert client.expect(pk.PubAck).reason_code == 0
        client.send(pk.Publish("svc/other", b"routed", 0))
        assert watcher.expect(pk.Publish).payload == b"routed"  # the refused and consumed ones never came
        client.close()
    kicked = RawClient(hosted.port)
    kicked.connect("kicked")
    kicked.send(pk.Publish("svc/kick", b"x", 1, packet_id=3))
    seen = kicked.expect_closed()
    assert isinstance(seen[-1], pk.Disconnect) and seen[-1].reason_code == rc.ADMINISTRATIVE_ACTION
    watcher.close()


@pytest.mark.parametrize("level", [5, 4], ids=["mqtt5", "mqtt311"])
def test_a_refusal_that_disconnects_is_never_acknowledged_to_a_311_client(hosted: InProcessBroker, level: int) -> None:
    """3.1.1 cannot be told no: a PUBACK would say "stored" for a message the service could not store, so
    the connection ends without one and the client resends; MQTT 5 reads the code, then the DISCONNECT."""
    client = RawClient(hosted.port, level)
    client.connect(f"unstored-{level}")
    client.send(pk.Publish("svc/unstored", b"x", 1, packet_id=4))
    seen = client.expect_closed()
    if level == 5:
        assert [(type(p), p.reason_code) for p in seen] == [(pk.PubAck, rc.QUOTA_EXCEEDED), (pk.Disconnect, rc.QUOTA_EXCEEDED)]
    else:
        assert seen == []
    client.close()


def test_services_hear_about_disconnects_and_can_disconnect_clients(hosted: InProcessBroker, service: ScriptedService) -> None:
    client = RawClient(hosted.port)
    client.connect("leaver")
    client.send(pk.Disconnect())
    client.expect_closed()
    target = RawClient(hosted.port)
    target.connect("target")

    async def kick() -> None:
        hosted.broker.disconnect("target", rc.ADMINISTRATIVE_ACTION, "maintenance")

    hosted.call(kick())
    seen = target.expect_closed()
    assert seen[-1] == pk.Disconnect(rc.ADMINISTRATIVE_ACTION, {pr.REASON_STRING: "maintenance"})
    assert service.disconnected[:2] == ["leaver", "target"]


def encode_all(packets: list[pk.Packet], level: int = pk.MQTT_5) -> bytes:
    return b"".join(encode(packet, level) for packet in packets)
