"""Real paho-mqtt clients against a real gateway process, each behaviour under MQTT 3.1.1 and 5 (the
``level`` fixture) unless its docstring says why it exists in MQTT 5 only. Absence is proven with a
sentinel message sent after the one that must not arrive, never by waiting."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.broker.codec import packets as pk
from testing.processes import GatewayProcess
from testing.waiting import wait_on
from tests.broker.clients import TIMEOUT, PahoClient, unique


def paho(port: int, level: int, client_id: str = "", **kwargs: Any) -> PahoClient:
    return PahoClient(port, client_id, v5=level == pk.MQTT_5, **kwargs)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_reaches_subscriber_at_each_qos(gateway: GatewayProcess, level: int, qos: int) -> None:
    topic = unique("qos") + "/data"
    sub = paho(gateway.port, level)
    pub = paho(gateway.port, level)
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


def test_granted_qos_caps_delivery_qos(gateway: GatewayProcess, level: int) -> None:
    topic = unique("cap")
    sub = paho(gateway.port, level)
    pub = paho(gateway.port, level)
    try:
        sub.connect()
        sub.subscribe(topic, 1)
        pub.connect()
        pub.publish(topic, b"x", 2)
        assert sub.get().qos == 1
    finally:
        sub.disconnect()
        pub.disconnect()


def test_retained_message_is_delivered_then_deleted_by_empty_payload(gateway: GatewayProcess, level: int) -> None:
    topic = unique("retained")
    pub = paho(gateway.port, level)
    pub.connect()
    pub.publish(topic, b"state-1", 1, retain=True)
    first = paho(gateway.port, level)
    second = paho(gateway.port, level)
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
        pub.publish(topic, b"sentinel", 1)  # not retained: the first thing a subscriber without a retained message gets
        assert second.get().payload == b"sentinel"
    finally:
        for client in (pub, first, second):
            client.disconnect()


def test_will_is_sent_on_abnormal_close_only(gateway: GatewayProcess, level: int) -> None:
    topic = unique("will")
    watcher = paho(gateway.port, level)
    watcher.connect()
    watcher.subscribe(topic, 1)
    try:
        dying = paho(gateway.port, level)
        dying.client.will_set(topic, b"gone", 1)
        dying.connect()
        dying.stop()  # socket closed without DISCONNECT
        assert watcher.get().payload == b"gone"

        polite_id = unique("polite")
        polite = paho(gateway.port, level, polite_id)
        polite.client.will_set(topic, b"should not appear", 1)
        polite.connect()
        polite.disconnect()
        # The same client id again: its CONNACK comes once the broker is done with the first connection
        # (will sent or not); a sentinel published after it is the watcher's next message.
        again = paho(gateway.port, level, polite_id)
        again.connect()
        again.publish(topic, b"sentinel", 1)
        assert watcher.get().payload == b"sentinel"
        again.disconnect()
    finally:
        watcher.disconnect()


def test_durable_session_receives_messages_published_while_offline(gateway: GatewayProcess, level: int) -> None:
    client_id = unique("durable")
    topic = unique("offline")
    sub = paho(gateway.port, level, client_id, clean=level == pk.MQTT_5)
    sub.connect(session_expiry=300)
    sub.subscribe(topic, 1)
    sub.disconnect()
    pub = paho(gateway.port, level)
    pub.connect()
    for index in range(5):
        pub.publish(topic, f"offline-{index}".encode(), 1)
    pub.disconnect()
    again = paho(gateway.port, level, client_id, clean=False)
    try:
        flags, reason, _ = again.connect(session_expiry=300)
        assert flags.session_present
        assert [again.get().payload for _ in range(5)] == [f"offline-{i}".encode() for i in range(5)]
    finally:
        again.disconnect()


def test_v5_properties_are_forwarded_untouched(gateway: GatewayProcess) -> None:
    """MQTT 5 only: 3.1.1 has no properties (a 3.1.1 subscriber gets them stripped, see the next test)."""
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


def test_a_v311_subscriber_gets_a_v5_message_without_its_properties(gateway: GatewayProcess) -> None:
    """Across versions: a 3.1.1 subscriber gets what a v5 publisher sent with properties, payload and QoS
    intact and no properties (3.1.1 has none to carry them)."""
    topic = unique("props-311")
    sub = paho(gateway.port, pk.MQTT_311)
    pub = paho(gateway.port, pk.MQTT_5)
    try:
        sub.connect()
        sub.subscribe(topic, 1)
        pub.connect()
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("site", "7")]
        props.ContentType = "application/json"
        pub.publish(topic, b'{"t": 21.5}', 1, properties=props)
        message = sub.get()
        assert (message.payload, message.qos, message.properties) == (b'{"t": 21.5}', 1, None)
    finally:
        sub.disconnect()
        pub.disconnect()


def test_subscription_options_no_local_and_retain_as_published(gateway: GatewayProcess) -> None:
    """MQTT 5 only: subscription options are MQTT 5's (a 3.1.1 SUBSCRIBE carries the QoS alone)."""
    topic = unique("options")
    client = PahoClient(gateway.port)
    other = PahoClient(gateway.port)
    try:
        client.connect()
        client.subscribe(topic, 1, noLocal=True, retainAsPublished=True)
        other.connect()
        client.publish(topic, b"own", 1)  # routed before its PUBACK, so before "theirs": the sentinel
        other.publish(topic, b"theirs", 1, retain=True)
        message = client.get()
        assert (message.payload, message.retain) == (b"theirs", True)
    finally:
        other.publish(topic, b"", 1, retain=True)
        client.disconnect()
        other.disconnect()


@pytest.mark.parametrize(("handling", "expected_first", "expected_again"), [(0, 1, 1), (1, 1, 0), (2, 0, 0)])
def test_retain_handling(gateway: GatewayProcess, handling: int, expected_first: int, expected_again: int) -> None:
    """MQTT 5 only: Retain Handling is a subscription option (3.1.1 always sends retained messages)."""
    topic = unique("rh")
    pub = PahoClient(gateway.port)
    client = PahoClient(gateway.port)
    try:
        pub.connect()
        pub.publish(topic, b"kept", 1, retain=True)
        client.connect()
        client.subscribe(topic, 1, retainHandling=handling)
        client.subscribe(topic, 1, retainHandling=handling)  # the same filter again: not new any more
        pub.publish(topic, b"sentinel", 1)  # routed after both SUBACKs, so after any retained copy
        got = []
        while (message := client.get()).payload != b"sentinel":
            got.append(message)
        assert len(got) == expected_first + expected_again
        assert all((m.payload, m.retain) == (b"kept", True) for m in got)
    finally:
        pub.publish(topic, b"", 1, retain=True)
        pub.disconnect()
        client.disconnect()


def test_subscription_identifiers_and_overlapping_subscriptions(gateway: GatewayProcess) -> None:
    """MQTT 5 only: Subscription Identifiers are a SUBSCRIBE property (the one delivery for overlapping
    subscriptions, in both versions, is the next test's)."""
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
        pub.publish(f"{base}/a/y", b"one", 1)
        message = client.get()  # the next message: no second copy of "both" came before it
        assert message.payload == b"one"
        assert message.properties.SubscriptionIdentifier == [11]
        assert message.qos == 0
    finally:
        client.disconnect()
        pub.disconnect()


def test_overlapping_subscriptions_get_one_delivery_at_the_highest_qos(gateway: GatewayProcess, level: int) -> None:
    base = unique("overlap")
    client = paho(gateway.port, level)
    pub = paho(gateway.port, level)
    try:
        client.connect()
        client.subscribe(f"{base}/#", 0)
        client.subscribe(f"{base}/+/x", 2)
        pub.connect()
        pub.publish(f"{base}/a/x", b"both", 2)
        pub.publish(f"{base}/a/y", b"one", 1)
        # paho hands over a QoS 2 message once its PUBREL is in, so "one" may come first; a second (QoS 0)
        # copy of "both" would be written before "one" and be one of the first two.
        received = sorted((message.payload, message.qos) for message in (client.get(), client.get()))
        assert received == [(b"both", 2), (b"one", 0)]
    finally:
        client.disconnect()
        pub.disconnect()


def test_shared_subscription_spreads_messages_over_members(gateway: GatewayProcess, level: int) -> None:
    """``$share/`` is MQTT 5's, but like mosquitto the broker honours it from 3.1.1 clients too."""
    topic = unique("work")
    members = [paho(gateway.port, level), paho(gateway.port, level)]
    pub = paho(gateway.port, level)
    inbox: queue.Queue[tuple[int, mqtt.MQTTMessage]] = queue.Queue()
    try:
        for number, member in enumerate(members):
            member.client.on_message = lambda c, u, message, number=number: inbox.put((number, message))
            member.connect()
            member.subscribe(f"$share/workers/{topic}", 1)
        pub.connect()
        for index in range(20):
            pub.publish(topic, str(index).encode(), 1)
        pub.publish(topic, b"sentinel", 1)  # routed after the 20 (the members keep no order between them)
        # 21 arrivals in any order: the 20 once each and the sentinel, so a duplicate written before the
        # sentinel (on either member) would take one of the 21 places.
        received = [inbox.get(timeout=TIMEOUT) for _ in range(21)]
        payloads = sorted(message.payload for _, message in received)
        assert payloads == sorted([str(index).encode() for index in range(20)] + [b"sentinel"])
        assert {number for number, message in received if message.payload != b"sentinel"} == {0, 1}
    finally:
        for client in (*members, pub):
            client.disconnect()


def test_sys_topics_report_clients_and_uptime(gateway: GatewayProcess, level: int) -> None:
    client = paho(gateway.port, level)
    try:
        client.connect()
        client.subscribe("$SYS/broker/#", 0)
        seen: dict[str, bytes] = {}
        live: set[str] = set()  # a retained value may predate this client's connection
        deadline = time.monotonic() + 5
        while (len(seen) < 5 or "$SYS/broker/clients/connected" not in live) and time.monotonic() < deadline:
            message = client.get()
            seen[message.topic] = message.payload
            if not message.retain:
                live.add(message.topic)
        assert "$SYS/broker/clients/connected" in live
        assert int(seen["$SYS/broker/clients/connected"]) >= 1
        assert seen["$SYS/broker/uptime"].endswith(b"seconds")
        assert "$SYS/broker/messages/received" in seen or "$SYS/broker/bytes/sent" in seen
    finally:
        client.disconnect()


def test_wildcard_subscription_does_not_match_sys_topics(gateway: GatewayProcess, level: int) -> None:
    """A live ``$SYS`` update reaches an explicit subscriber while ``#`` and ``+/broker/#`` are in place;
    a sentinel published after it is the first thing the wildcard subscriber gets with a ``$`` checked."""
    client = paho(gateway.port, level)
    observer = paho(gateway.port, level)
    sentinel = unique("after-sys")
    try:
        client.connect()
        client.subscribe("#", 0)
        client.subscribe("+/broker/#", 0)
        observer.connect()
        observer.subscribe("$SYS/broker/uptime", 0)
        while observer.get().retain:
            pass  # the retained value predates the wildcard subscriptions; a live update comes after them
        observer.publish(sentinel, b"after the update", 1)
        while (message := client.get()).topic != sentinel:
            assert not message.topic.startswith("$"), message.topic
    finally:
        client.disconnect()
        observer.disconnect()


def test_unsubscribe_stops_delivery(gateway: GatewayProcess, level: int) -> None:
    topic = unique("unsub")
    client = paho(gateway.port, level)
    try:
        client.connect()
        client.subscribe(topic, 1)
        client.subscribe(f"{topic}/sentinel", 1)
        client.publish(topic, b"one", 1)
        assert client.get().payload == b"one"
        result, _mid = client.client.unsubscribe(topic)
        assert result == mqtt.MQTT_ERR_SUCCESS
        client.publish(topic, b"two", 1)  # acknowledged after the UNSUBACK: requests are handled in order
        client.publish(f"{topic}/sentinel", b"sentinel", 1)
        assert client.get().payload == b"sentinel"
    finally:
        client.disconnect()


def test_session_takeover_is_reported_to_the_old_paho_client(gateway: GatewayProcess, level: int) -> None:
    """MQTT 5 tells the old client why (DISCONNECT 0x8E); 3.1.1 has no server DISCONNECT, so paho sees
    its connection lost (reported as "Unspecified error")."""
    client_id = unique("paho-takeover")
    old = paho(gateway.port, level, client_id)
    new = paho(gateway.port, level, client_id)
    try:
        old.connect()
        old.client.reconnect_delay_set(60, 60)  # do not fight back for the client id during the test
        new.connect()
        reason = old.disconnects.get(timeout=10)
        assert reason.value == (0x8E if level == pk.MQTT_5 else 0x80)  # Session taken over / connection lost
    finally:
        old.client.loop_stop()
        new.disconnect()


def test_paho_keepalive_pings_keep_the_connection(gateway: GatewayProcess, level: int) -> None:
    """paho pings every keep-alive second; two answered pings take the connection past the 1.5 s the
    broker would allow a silent one, without a disconnect."""
    client = paho(gateway.port, level)
    pongs = threading.Condition()
    answered: list[str] = []

    def on_log(_client: object, _userdata: object, _level: int, line: str) -> None:
        if line.startswith("Received PINGRESP"):
            with pongs:
                answered.append(line)
                pongs.notify_all()

    client.client.on_log = on_log
    try:
        client.connect(keepalive=1)
        wait_on(pongs, lambda: len(answered) >= 2, timeout=TIMEOUT, what="two PINGRESPs")
        assert client.disconnects.empty()
        topic = unique("alive")
        client.subscribe(topic, 1)
        client.publish(topic, b"still here", 1)
        assert client.get().payload == b"still here"
        assert client.disconnects.empty()
    finally:
        client.disconnect()


def test_outbound_topic_aliases_are_reused_for_more_topics_than_aliases(gateway: GatewayProcess) -> None:
    """MQTT 5 only: topic aliases are a PUBLISH property. A paho v5 subscriber allowing 3 aliases receives 10
    distinct topics in a mixed order. paho reports an aliased PUBLISH as it came (topic "" plus the alias), so
    the test maps aliases as the MQTT 5 receiver rules say (3.3.2.3.4): a topic with an alias sets or replaces
    the mapping."""
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
