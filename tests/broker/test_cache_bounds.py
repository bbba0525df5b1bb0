"""Caches keyed by what a client sends stay bounded in bytes under hostile keys (``cache_bounds``).

A topic name can be 65,535 bytes: before, each cache was capped only by its entry count, so 500
distinct 60 KB topics left 30 MB in the subscription tree's match cache (the worst case was ~4 GB per
cache). Each test drives distinct long keys through the real component and measures what it still holds
afterwards with ``tracemalloc`` (the keys themselves are made and dropped one at a time, so only what the
component kept is counted). The bounds are literal numbers, the documented ones plus a margin.
"""

from __future__ import annotations

import gc
import re
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.codec import packets as pk
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.writer import encode
from appliance.broker.handlers.connect import flap_delay
from appliance.broker.handlers.publish import services_for
from appliance.broker.routing.topic_tree import SubscriptionOptions, SubscriptionTree
from appliance.broker.security.acl import Acl
from appliance.prometheus import render
from tests.broker.pair import BrokerPair

MB = 1024 * 1024
#: 500 distinct 60 KB topics: 30 MB of keys if a cache keeps them.
LONG_TOPICS = 500
LONG_TOPIC_CHARS = 60_000


def long_topics(count: int = LONG_TOPICS, chars: int = LONG_TOPIC_CHARS) -> Iterator[str]:
    """Distinct topics of ``chars`` characters, each made only when asked for."""
    for index in range(count):
        yield f"t/{index:08d}/" + "x" * (chars - 12)


def retained_bytes(drive: Callable[[], None]) -> int:
    """Bytes still allocated after ``drive`` returns (what the component under test kept)."""
    gc.collect()
    tracemalloc.start()
    try:
        drive()
        gc.collect()
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def subscribed_tree() -> SubscriptionTree:
    tree = SubscriptionTree()
    tree.subscribe("monitor", "#", SubscriptionOptions())
    tree.subscribe("device", "t/+/#", SubscriptionOptions(qos=1))
    return tree


def test_the_match_cache_does_not_keep_long_topics() -> None:
    tree = subscribed_tree()
    tree.match("t/1/short")

    def drive() -> None:
        for topic in long_topics():
            assert set(tree.match(topic).subscribers) == {"monitor", "device"}

    assert retained_bytes(drive) < 1 * MB  # was 30 MB
    assert tree.match("t/1/short") is tree.match("t/1/short")  # the short topic is still cached


def test_the_match_cache_is_bounded_in_bytes_for_many_cacheable_topics() -> None:
    """20,000 distinct 1,000-character topics (each short enough to cache) held 29 MB before; the
    budget is 16 MiB of keys and results."""
    tree = subscribed_tree()

    def drive() -> None:
        for topic in long_topics(20_000, 1_000):
            tree.match(topic)

    assert retained_bytes(drive) < 18 * MB
    assert tree.cache_bytes <= 16 * MB


@given(st.lists(st.text(st.characters(blacklist_characters="+#\x00"), max_size=1_500), max_size=60))
def test_the_match_cache_counts_what_it_holds_and_answers_as_an_uncached_walk(topics: list[str]) -> None:
    tree = subscribed_tree()
    for topic in topics:
        cached = tree.match(topic)
        assert cached == SubscriptionTree._walk(tree, topic)
    assert all(len(topic) <= 1024 for topic in tree._cache.entries)
    assert tree.cache_bytes >= sum(len(topic) + 400 for topic in tree._cache.entries)
    assert tree.cache_bytes <= 16 * MB


def enforced_acl() -> Acl:
    return Acl.parse("topic readwrite t/#\npattern readwrite clients/%c/#\n", "acl")


def test_the_acl_decision_cache_does_not_keep_long_topics() -> None:
    acl = enforced_acl()

    def drive() -> None:
        for topic in long_topics():
            assert acl.can_publish("device-1", None, topic)
            assert not acl.can_publish("device-1", None, "u/" + topic)

    assert retained_bytes(drive) < 1 * MB  # was 60 MB


def test_the_acl_decision_cache_is_bounded_in_bytes_for_many_cacheable_topics() -> None:
    """10,000 distinct 1,000-character topics held 11.5 MB before; the budget is 8 MiB."""
    acl = enforced_acl()

    def drive() -> None:
        for topic in long_topics(10_000, 1_000):
            acl.can_publish("device-1", None, topic)

    assert retained_bytes(drive) < 9 * MB
    assert acl.cache_bytes <= 8 * MB


def test_the_acl_decision_cache_does_not_keep_long_client_ids() -> None:
    acl = enforced_acl()

    def drive() -> None:
        for index in range(500):
            client_id = f"{index:08d}" + "c" * 60_000
            assert acl.can_publish(client_id, None, f"clients/{client_id}/state")

    assert retained_bytes(drive) < 1 * MB  # was 60 MB


def publish_frames(topics: Iterator[str]) -> Iterator[bytes]:
    for topic in topics:
        yield encode(pk.Publish(topic, b"1"), pk.MQTT_311)


def test_the_readers_topic_cache_does_not_keep_long_topics() -> None:
    reader = PacketReader()

    def drive() -> None:
        for frame in publish_frames(long_topics(256)):
            [publish] = reader.feed(frame)
            assert isinstance(publish, pk.Publish)

    assert retained_bytes(drive) < 64 * 1024  # was 256 x (60 KB of bytes + 60 KB of str) = 30 MB


def test_the_readers_topic_cache_is_bounded_in_bytes_for_many_cacheable_topics() -> None:
    """A connection's cache: 8 KiB of raw topics (~50 KB with their strs), not 256 x 2 KB."""
    reader = PacketReader()
    frames = list(publish_frames(long_topics(1_000, 1_000)))

    def drive() -> None:
        for frame in frames:
            reader.feed(frame)

    assert retained_bytes(drive) < 64 * 1024  # was 0.5 MB
    # a device's handful of repeated topics is still answered from the cache
    frame = encode(pk.Publish("devices/d1/messages/events/", b"1"), pk.MQTT_311)
    first = reader.feed(frame)[0]
    second = reader.feed(frame)[0]
    assert isinstance(first, pk.Publish) and isinstance(second, pk.Publish)
    assert first.topic is second.topic


class TopicService:
    """A broker service that only declares its filter (``services_for`` matches, never calls it)."""

    topic_filters = ("t/#",)


def test_the_service_cache_does_not_keep_long_topics(tmp_path: Path) -> None:
    pair = BrokerPair(tmp_path)
    service = TopicService()
    pair.broker.service_filters = [("t/#", service)]  # type: ignore[list-item]

    def drive() -> None:
        for topic in long_topics():
            assert services_for(pair.broker, topic) == (service,)

    try:
        assert retained_bytes(drive) < 1 * MB  # was 30 MB
    finally:
        pair.stop()


def test_session_takeovers_of_many_distinct_client_ids_do_not_grow_the_flap_histories() -> None:
    """Each distinct client id taken over once left its history (and its id) for ever: 300 x 60 KB ids
    held 18 MB of ids before. At most ``TAKEOVER_HISTORIES`` (256) are kept."""
    pair = BrokerPair()
    try:
        for index in range(300):
            client_id = f"{index:08d}" + "c" * 60_000
            first = pair.connected(client_id, pk.MQTT_311)
            second = pair.connected(client_id, pk.MQTT_311)  # the takeover
            second.drop()
            first.drop()
            pair.advance(0.1)
        assert len(pair.broker.takeovers) <= 256
        assert sum(map(len, pair.broker.takeovers)) <= 256 * 60_008
    finally:
        pair.stop()


def test_a_flapping_client_is_still_slowed_down_among_many_others() -> None:
    """Forgetting old histories keeps the recent ones: a client id taken over again and again within
    FLAP_WINDOW is still delayed after hundreds of other ids were taken over long ago."""
    pair = BrokerPair()
    try:
        for index in range(300):
            client_id = f"other-{index}"
            first = pair.connected(client_id, pk.MQTT_311)
            pair.connected(client_id, pk.MQTT_311).drop()
            first.drop()
        pair.advance(60)
        pair.connected("flapper", pk.MQTT_311)
        for _ in range(5):
            pair.client(pk.MQTT_311).send(pk.Connect(pk.MQTT_311, "flapper", True, 0))
            pair.advance(0.5)
        assert len(pair.broker.takeovers["flapper"]) == 5
        assert flap_delay(pair.broker, "flapper", pair.runtime.monotonic()) > 0
        assert len(pair.broker.takeovers) <= 256
    finally:
        pair.stop()


@given(st.lists(st.integers(1, 2_000), max_size=80))
def test_the_readers_topic_cache_stays_in_its_budget_and_decodes_as_uncached(lengths: list[int]) -> None:
    reader = PacketReader()
    for index, length in enumerate(lengths):
        topic = (f"{index}/" + "é" * length)[:length]
        [publish] = reader.feed(encode(pk.Publish(topic, b"1"), pk.MQTT_311))
        assert isinstance(publish, pk.Publish) and publish.topic == topic
        assert reader._topic_bytes == sum(map(len, reader._topics)) <= 8192
        assert all(len(raw) <= 1024 for raw in reader._topics)


def test_round_robin_positions_of_shared_subscriptions_that_are_gone_do_not_pile_up() -> None:
    """A shared group's position outlived its subscription: 200 groups on distinct 30 KB filters, each
    subscribed, published to once and unsubscribed, kept 6 MB of filters before. ``SHARE_CURSOR_BYTES``."""
    pair = BrokerPair()
    try:
        member = pair.connected("member", pk.MQTT_5)
        publisher = pair.connected("publisher", pk.MQTT_5)
        for index in range(200):
            topic = f"t/{index:08d}/" + "x" * 30_000
            member.subscribe(f"$share/g/{topic}")
            publisher.send(pk.Publish(topic, b"1"))
            assert isinstance(member.received()[0], pk.Publish)
            member.send(pk.Unsubscribe(2, [f"$share/g/{topic}"]))
            member.expect(pk.Unsuback)
        cursors = pair.broker.router._share_cursor
        assert sum(len(group) + len(topic_filter) for group, topic_filter in cursors) <= 1024 * 1024
        assert pair.broker.router.share_cursor_bytes <= 1024 * 1024
    finally:
        pair.stop()


def test_the_prometheus_page_shows_what_the_caches_hold_against_their_budgets() -> None:
    pair = BrokerPair(acl=enforced_acl())
    try:
        watcher = pair.connected("watcher", pk.MQTT_5)
        watcher.subscribe("t/#")
        publisher = pair.connected("publisher", pk.MQTT_5)
        for topic in long_topics(3, 100):
            publisher.send(pk.Publish(topic, b"1"))
        page = render(pair.broker.metrics())
        held = dict(re.findall(r'^appliance_broker_cache_bytes\{cache="(\w+)"\} (\d+)$', page, re.MULTILINE))
        limits = dict(re.findall(r'^appliance_broker_cache_limit_bytes\{cache="(\w+)"\} (\d+)$', page, re.MULTILINE))
        routes = pair.broker.short_path.route_cache  # type: ignore[union-attr]
        assert held == {"topic_match": str(pair.broker.tree.cache_bytes), "acl_decisions": str(pair.broker.acl.cache_bytes),
                        "short_path_routes": str(routes.held_bytes)}
        assert int(held["topic_match"]) >= 3 * 500 and int(held["acl_decisions"]) >= 3 * 300  # keys plus estimates
        assert limits == {"topic_match": str(16 * MB), "acl_decisions": str(8 * MB), "short_path_routes": str(16 * MB)}
    finally:
        pair.stop()
