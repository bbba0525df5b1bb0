"""The outbound in-flight cap (``[broker.limits] max_inflight_messages``): a subscriber that does not
acknowledge gets at most that many QoS 1 messages, whatever its protocol version, and one more for every
acknowledgement. 3.1.1 has no Receive Maximum, so without the cap such a client got the whole queue.

"Exactly N" is asserted without waiting for time to pass: the publisher waits for all its PUBACKs (every
message routed), then the subscriber sends PINGREQ; the broker writes a connection's bytes in order, so
every PUBLISH it sent to the subscriber arrives before the PINGRESP."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.config import LimitsConfig
from appliance.config.errors import ConfigError
from appliance.config.schema import parse_section
from testing.processes import GatewayProcess
from tests.broker.clients import RawClient, unique

CAP = 20  # the default, like mosquitto's


def publishes_before_pingresp(client: RawClient) -> list[pk.Publish]:
    client.send(pk.PingReq())
    received: list[pk.Publish] = []
    while True:
        packet = client.recv()
        if isinstance(packet, pk.PingResp):
            return received
        assert isinstance(packet, pk.Publish), packet
        received.append(packet)


def publish_qos1(port: int, topic: str, count: int) -> None:
    publisher = RawClient(port)
    publisher.connect(unique("pub"))
    for number in range(count):
        publisher.send(pk.Publish(topic, str(number).encode(), qos=1, packet_id=number + 1))
    acked = {publisher.expect(pk.PubAck).packet_id for _ in range(count)}
    assert acked == set(range(1, count + 1))
    publisher.close()


@pytest.mark.parametrize(("level", "receive_maximum"), [(4, None), (5, None), (5, 64), (5, 5)],
                         ids=["mqtt311", "mqtt5", "mqtt5-receive-maximum-64", "mqtt5-receive-maximum-5"])
def test_a_subscriber_that_never_acks_gets_at_most_the_cap(
    gateway: GatewayProcess, level: int, receive_maximum: int | None
) -> None:
    topic = unique("inflight")
    subscriber = RawClient(gateway.port, level=level)
    properties = {0x21: receive_maximum} if receive_maximum else {}
    subscriber.connect(unique("sub"), properties=properties)
    subscriber.subscribe(topic, 1)
    publish_qos1(gateway.port, topic, 50)
    window = min(receive_maximum or CAP, CAP)

    first = publishes_before_pingresp(subscriber)
    assert [p.payload for p in first] == [str(n).encode() for n in range(window)]

    # Each acknowledgement lets exactly one more through, in order.
    subscriber.send(pk.PubAck(first[0].packet_id))
    subscriber.send(pk.PubAck(first[1].packet_id))
    more = publishes_before_pingresp(subscriber)
    assert [p.payload for p in more] == [str(n).encode() for n in range(window, window + 2)]
    subscriber.close()


def test_max_inflight_messages_is_validated_with_its_field_path() -> None:
    """Version-free: configuration parsing."""
    assert parse_section(LimitsConfig, {}, "broker.limits", Path()).max_inflight_messages == 20
    assert parse_section(LimitsConfig, {"max_inflight_messages": 0}, "broker.limits", Path()).max_inflight_messages == 0
    with pytest.raises(ConfigError) as error:
        parse_section(LimitsConfig, {"max_inflight_messages": -1}, "broker.limits", Path())
    assert error.value.path == "broker.limits.max_inflight_messages"
