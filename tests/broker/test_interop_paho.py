"""Real paho-mqtt clients (MQTT 3.1.1 and 5) against a real gateway process."""

from __future__ import annotations

import queue
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.broker.clients import PahoClient, unique
from tests.support.processes import GatewayProcess

VERSIONS = [pytest.param(True, id="v5"), pytest.param(False, id="v311")]


@pytest.mark.parametrize("v5", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_reaches_subscriber_at_each_qos(gateway: GatewayProcess, v5: bool, qos: int) -> None:
    topic = unique("qos") + "/data"
    sub = PahoClient(gateway.port, v5=v5)
    pub = PahoClient(gateway.port, v5=v5)
    try:
        sub.connect()
        assert sub.subscribe(topic.split("/")[0] + "/+", qos)[0] == qos
        pub.connect()
        for index in range(20):
            pub.publish(topic, f"m{index}".encode(), qos)
        received = [sub.get() for _ in range(20)]
        assert [m.payload for m in received] == [f"m{i}".encode() for i in range(20)]
        assert {m.qos for m in received} == {qos}
        assert all(m.topic == topic for m in received)
    finally:
        sub.disconnect()
        pub.disconnect()


@pytest.mark.parametrize("v5", VERSIONS)
def test_granted_qos_caps_delivery_qos(gateway: GatewayProcess, v5: bool) -> None:
    topic = unique("cap")
    sub = PahoClient(gateway.port, v5=v5)
    pub = PahoClient(gateway.port, v5=v5)
    try:
        sub.connect()
        sub.subscribe(topic, 1)
        pub.connect()
        pub.publish(topic, b"x", 2)
        assert sub.get().qos == 1
    finally:
        sub.disconnect()
        pub.disconnect()


@pytest.mark.parametrize("v5", VERSIONS)
def test_retained_message_is_delivered_then_deleted_by_empty_payload(gateway: GatewayProcess, v5: bool) -> None:
    topic = unique("retained")
    pub = PahoClient(gateway.port, v5=v5)
    pub.connect()
    pub.publish(topic, b"state-1", 1, retain=True)
    first = PahoClient(gateway.port, v5=v5)
    second = PahoClient(gateway.port, v5=v5)
    try:
        first.connect()
        first.subscribe(topic, 1)
        message = first.get()
        assert (message.payload, message.retain) == (b"state-1", True)
        pub.publish(topic, b"state-2", 1, retain=True)
        live = first.get()
        assert (live.payload, live.retain) == (b"state-2", False)  # live delivery: retain flag cleared
        pub.publish(topic, b"", 1, retain=True)
        assert first.get().payload == b""
        second.connect()
        second.subscribe(topic, 1)
        second.assert_nothing()
    finally:
        for client in (pub, first, second):
            client.disconnect()


@pytest.mark.parametrize("v5", VERSIONS)
def test_will_is_sent_on_abnormal_close_only(gateway: GatewayProcess, v5: bool) -> None:
    topic = unique("will")
    watcher = PahoClient(gateway.port, v5=v5)
    watcher.connect()
    watcher.subscribe(topic, 1)
    try:
        dying = PahoClient(gateway.port, v5=v5)
        dying.client.will_set(topic, b"gone", 1)
        dying.connect()
        dying.stop()  # socket closed without DISCONNECT
        assert watcher.get().payload == b"gone"

        polite = PahoClient(gateway.port, v5=v5)
        polite.client.will_set(topic, b"should not appear", 1)
        polite.connect()
        polite.disconnect()
        watcher.assert_nothing()
    finally:
        watcher.disconnect()


@pytest.mark.parametrize("v5", VERSIONS)
def test_durable_session_receives_messages_published_while_offline(gateway: GatewayProcess, v5: bool) -> None:
    client_id = unique("durable")
    topic = unique("offline")
    sub = PahoClient(gateway.port, client_id, v5=v5, clean=v5)
    sub.connect(session_expiry=300)
    sub.subscribe(topic, 1)
    sub.disconnect()
    pub = PahoClient(gateway.port, v5=v5)
    pub.connect()
    for index in range(5):
        pub.publish(topic, f"offline-{index}".encode(), 1)
    pub.disconnect()
    again = PahoClient(gateway.port, client_id, v5=v5, clean=False)
    try:
        flags, reason, _ = again.connect(session_expiry=300)
        assert flags.session_present
        assert [again.get().payload for _ in range(5)] == [f"offline-{i}".encode() for i in range(5)]
    finally:
        again.disconnect()


def test_v5_properties_are_forwarded_untouched(gateway: GatewayProcess) -> None:
    topic = unique("props")
    sub = PahoClient(gateway.port)
    pub = PahoClient(gateway.port)
    try:
        sub.connect()
        sub.subscribe(topic, 1)
        pub.connect()
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("site", "7"), ("site", "8"), ("unit", "°C")]
        props.ContentType = "application/json"
        props.ResponseTopic = "reply/here"
        props.CorrelationData = b"\x00\x01corr"
        props.PayloadFormatIndicator = 1
        props.MessageExpiryInterval = 3600
        pub.publish(topic, b'{"t": 21.5}', 1, properties=props)
        message = sub.get()
        got = message.properties
        assert got.UserProperty == [("site", "7"), ("site", "8"), ("unit", "°C")]
        assert got.ContentType == "application/json"
        assert got.ResponseTopic == "reply/here"
        assert got.CorrelationData == b"\x00\x01corr"
        assert got.PayloadFormatIndicator == 1
        assert 3598 <= got.MessageExpiryInterval <= 3600
    finally:
        sub.disconnect()
        pub.disconnect()


def test_subscription_options_no_local_and_retain_as_published(gateway: GatewayProcess) -> None:
    topic = unique("options")
    client = PahoClient(gateway.port)
    other = PahoClient(gateway.port)
    try:
        client.connect()
        client.subscribe(topic, 1, noLocal=True, retainAsPublished=True)
        other.connect()
        client.publish(topic, b"own", 1)
        other.publish(topic, b"theirs", 1, retain=True)
        message = client.get()
        assert (message.payload, message.retain) == (b"theirs", True)
        client.assert_nothing()
    finally:
        other.publish(topic, b"", 1, retain=True)
        client.disconnect()
        other.disconnect()


@pytest.mark.parametrize(("handling", "expected_first", "expected_again"), [(0, 1, 1), (1, 1, 0), (2, 0, 0)])
def test_retain_handling(gateway: GatewayProcess, handling: int, expected_first: int, expected_again: int) -> None:
    topic = unique("rh")
    pub = PahoClient(gateway.port)
    client = PahoClient(gateway.port)
    try:
        pub.connect()
        pub.publish(topic, b"kept", 1, retain=True)
        client.connect()
        client.subscribe(topic, 1, retainHandling=handling)
        client.subscribe(topic, 1, retainHandling=handling)  # the same filter again: not new any more
        got = []
        while True:
            try:
                got.append(client.get(timeout=0.5))
            except queue.Empty:
                break
        assert len(got) == expected_first + expected_again
    finally:
        pub.publish(topic, b"", 1, retain=True)
        pub.disconnect()
        client.disconnect()


def test_subscription_identifiers_and_overlapping_subscriptions(gateway: GatewayProcess) -> None:
    base = unique("subid")
    client = PahoClient(gateway.port)
    pub = PahoClient(gateway.port)
    try:
        client.connect()
        for identifier, topic_filter, qos in ((11, f"{base}/#", 0), (22, f"{base}/+/x", 2)):
            props = Properties(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = identifier
            client.subscribe(topic_filter, qos, properties=props)
        pub.connect()
        pub.publish(f"{base}/a/x", b"both", 2)
        message = client.get()
        assert message.qos == 2  # one delivery with the highest QoS
        assert sorted(message.properties.SubscriptionIdentifier) == [11, 22]
        client.assert_nothing()
        pub.publish(f"{base}/a/y", b"one", 1)
        message = client.get()
        assert message.properties.SubscriptionIdentifier == [11]
        assert message.qos == 0
    finally:
        client.disconnect()
        pub.disconnect()


def test_shared_subscription_spreads_messages_over_members(gateway: GatewayProcess) -> None:
    topic = unique("work")
    members = [PahoClient(gateway.port), PahoClient(gateway.port)]
    pub = PahoClient(gateway.port)
    try:
        for member in members:
            member.connect()
            member.subscribe(f"$share/workers/{topic}", 1)
        pub.connect()
        for index in range(20):
            pub.publish(topic, str(index).encode(), 1)
        counts = []
        payloads = []
        for member in members:
            count = 0
            while True:
                try:
                    payloads.append(int(member.get(timeout=0.5).payload))
                    count += 1
                except queue.Empty:
                    break
            counts.append(count)
        assert sorted(payloads) == list(range(20))
        assert min(counts) > 0
    finally:
        for client in (*members, pub):
            client.disconnect()


def test_sys_topics_report_clients_and_uptime(gateway: GatewayProcess) -> None:
    client = PahoClient(gateway.port)
    try:
        client.connect()
        client.subscribe("$SYS/broker/#", 0)
        seen: dict[str, bytes] = {}
        deadline = time.monotonic() + 5
        while len(seen) < 5 and time.monotonic() < deadline:
            message = client.get()
            seen[message.topic] = message.payload
        assert int(seen["$SYS/broker/clients/connected"]) >= 1
        assert seen["$SYS/broker/uptime"].endswith(b"seconds")
        assert "$SYS/broker/messages/received" in seen or "$SYS/broker/bytes/sent" in seen
    finally:
        client.disconnect()


def test_wildcard_subscription_does_not_match_sys_topics(gateway: GatewayProcess) -> None:
    client = PahoClient(gateway.port)
    try:
        client.connect()
        client.subscribe("#", 0)
        client.subscribe("+/broker/#", 0)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                message = client.get(timeout=0.3)
            except queue.Empty:
                continue
            assert not message.topic.startswith("$"), message.topic
    finally:
        client.disconnect()


def test_paho_v311_unsubscribe_stops_delivery(gateway: GatewayProcess) -> None:
    topic = unique("unsub")
    client = PahoClient(gateway.port, v5=False)
    try:
        client.connect()
        client.subscribe(topic, 1)
        client.publish(topic, b"one", 1)
        assert client.get().payload == b"one"
        result, _mid = client.client.unsubscribe(topic)
        assert result == mqtt.MQTT_ERR_SUCCESS
        client.publish(topic, b"two", 1)  # acknowledged after the UNSUBACK: requests are handled in order
        client.assert_nothing()
    finally:
        client.disconnect()


def test_session_takeover_is_reported_to_the_old_paho_client(gateway: GatewayProcess) -> None:
    client_id = unique("paho-takeover")
    old = PahoClient(gateway.port, client_id)
    new = PahoClient(gateway.port, client_id)
    try:
        old.connect()
        old.client.reconnect_delay_set(60, 60)  # do not fight back for the client id during the test
        new.connect()
        reason = old.disconnects.get(timeout=10)
        assert reason.value == 0x8E  # Session taken over
    finally:
        old.client.loop_stop()
        new.disconnect()


@pytest.mark.parametrize("v5", VERSIONS)
def test_paho_keepalive_pings_keep_the_connection(gateway: GatewayProcess, v5: bool) -> None:
    client = PahoClient(gateway.port, v5=v5)
    try:
        client.connect(keepalive=1)
        with pytest.raises(queue.Empty):
            client.disconnects.get(timeout=3)  # three keep-alive periods pass without a disconnect
        topic = unique("alive")
        client.subscribe(topic, 1)
        client.publish(topic, b"still here", 1)
        assert client.get().payload == b"still here"
    finally:
        client.disconnect()


def test_outbound_topic_aliases_are_reused_for_more_topics_than_aliases(gateway: GatewayProcess) -> None:
    """A paho v5 subscriber allowing 3 aliases receives 10 distinct topics in a mixed order. paho reports
    an aliased PUBLISH as it came (topic "" plus the alias), so the test maps aliases as the MQTT 5
    receiver rules say (3.3.2.3.4): a topic with an alias sets or replaces the mapping."""
    prefix = unique("alias")
    subscriber = PahoClient(gateway.port, unique("alias-sub"))
    subscriber.connect(TopicAliasMaximum=3)
    subscriber.subscribe(f"{prefix}/#", 1)
    publisher = PahoClient(gateway.port, unique("alias-pub"))
    publisher.connect()
    sent = [f"{prefix}/{n % 10}/{'x' * 30}" for n in (0, 1, 2, 0, 3, 4, 0, 1, 5, 6, 7, 8, 9, 2, 2, 5, 0)]
    for number, topic in enumerate(sent):
        publisher.publish(topic, str(number), qos=1)
    aliases: dict[int, str] = {}
    received: list[tuple[str, bytes]] = []
    used = set()
    for _ in sent:
        message = subscriber.get()
        alias = message.properties.TopicAlias
        assert 1 <= alias <= 3
        used.add(alias)
        if message.topic:
            aliases[alias] = message.topic
        else:
            assert alias in aliases, "an alias the broker never established"
        received.append((aliases[alias], message.payload))
    assert received == [(topic, str(number).encode()) for number, topic in enumerate(sent)]
    assert used == {1, 2, 3}
    subscriber.disconnect()
    publisher.disconnect()
