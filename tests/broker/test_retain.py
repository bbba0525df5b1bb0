"""The retained-message index against the obvious reference: a list scanned with the regex-based matcher
of ``test_topic_tree``, in the order topics were first retained. Hypothesis builds many retained topics
(sharing prefixes, with ``$`` and empty levels), deletes and expires some, and checks every filter."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.routing.message import BrokerMessage
from appliance.broker.routing.retain import RetainedMessages
from testing.campaigns import campaign
from tests.broker.test_topic_tree import reference_matches

NOW = 1_000_000.0
NAMES = st.sampled_from(["a", "b", "c", "", "$SYS", "$x", "sensor"])
TOPICS = st.lists(NAMES, min_size=1, max_size=4).map("/".join).filter(bool)
FILTER_LEVELS = st.one_of(NAMES, st.just("+"))
FILTERS = st.tuples(st.lists(FILTER_LEVELS, min_size=1, max_size=4), st.booleans()).map(
    lambda parts: "/".join(parts[0] + (["#"] if parts[1] else []))
).filter(bool) | st.just("#")


def retained(topic: str, payload: bytes = b"v", expires_at: float | None = None) -> BrokerMessage:
    return BrokerMessage(topic, payload, 1, True, {}, "origin", expires_at)


# (topic, action): 0 retain, 1 delete (empty payload), 2 retain already expired
OPERATIONS = st.lists(st.tuples(TOPICS, st.sampled_from([0, 0, 0, 1, 2])), max_size=60)


@campaign(300, deadline=None)
@given(OPERATIONS, st.lists(FILTERS, min_size=1, max_size=8))
def test_matching_equals_a_scan_of_every_retained_topic(operations: list[tuple[str, int]], filters: list[str]) -> None:
    index = RetainedMessages()
    reference: dict[str, BrokerMessage] = {}  # insertion-ordered, like the scan it replaced
    for number, (topic, action) in enumerate(operations):
        if action == 1:
            assert index.update(retained(topic, b"")) == (topic in reference)
            reference.pop(topic, None)
        else:
            message = retained(topic, str(number).encode(), NOW - 1 if action == 2 else None)
            assert index.update(message)
            reference[topic] = message  # a topic retained again keeps its place
    assert len(index) == len(reference)
    for topic_filter in filters:
        expected = [m for t, m in reference.items() if reference_matches(topic_filter, t) and not m.expired(NOW)]
        assert index.matching(topic_filter, NOW) == expected, topic_filter
        for topic in [t for t, m in reference.items() if reference_matches(topic_filter, t) and m.expired(NOW)]:
            del reference[topic]  # looking at an expired message drops it
        assert len(index) == len(reference)


def test_many_retained_topics_and_pruning() -> None:
    index = RetainedMessages()
    for site in range(50):
        for device in range(40):
            index.update(retained(f"site/{site}/dev/{device}", f"{site}.{device}".encode()))
    assert len(index) == 2000
    got = index.matching("site/+/dev/7", NOW)
    assert [m.payload for m in got] == [f"{site}.7".encode() for site in range(50)]
    assert len(index.matching("site/3/#", NOW)) == 40
    for device in range(40):
        assert index.update(retained(f"site/3/dev/{device}", b""))
    assert index.matching("site/3/#", NOW) == []
    assert not index.update(retained("site/3/dev/0", b""))
    assert "3" not in index._root.children["site"].children  # emptied branches are pruned
    assert len(index) == 1960


DEEP_TOPICS = st.lists(NAMES, min_size=1, max_size=8).map("/".join).filter(bool)
DEEP_FILTERS = st.tuples(st.lists(FILTER_LEVELS, min_size=1, max_size=8), st.booleans()).map(
    lambda parts: "/".join(parts[0] + (["#"] if parts[1] else []))
).filter(bool) | st.just("#")


@campaign(300, deadline=None)
@given(st.lists(DEEP_TOPICS, max_size=30), st.lists(DEEP_FILTERS, min_size=1, max_size=6), st.randoms())
def test_deep_topics_share_edges_and_give_every_node_back(topics: list[str], filters: list[str], rng) -> None:
    """Topics deep enough that chains of levels are stored as one edge, split by later topics and joined
    again by deletions: every filter still finds exactly the scan's matches, in order, and deleting every
    topic leaves no node behind."""
    index = RetainedMessages()
    reference: dict[str, BrokerMessage] = {}
    for number, topic in enumerate(topics):
        message = retained(topic, str(number).encode())
        index.update(message)
        reference[topic] = message
    assert index.node_count() <= sum(t.count("/") + 1 for t in reference)
    remaining = list(reference)
    rng.shuffle(remaining)
    while True:
        for topic_filter in filters:
            expected = [m for t, m in reference.items() if reference_matches(topic_filter, t)]
            assert index.matching(topic_filter, NOW) == expected, topic_filter
        if not remaining:
            break
        topic = remaining.pop()
        assert index.update(retained(topic, b""))
        del reference[topic]
    assert index.node_count() == 0 and len(index) == 0


def test_a_16000_level_retained_topic_costs_what_its_text_costs() -> None:
    """With ``max_topic_levels`` raised, a retained message on a 16,000-level topic must not cost a node
    per level (before: ~4 MB for a 32 KB topic)."""
    deep = "a/" * 15_999 + "b"
    index = RetainedMessages()
    index.update(retained("a/other"))
    tracemalloc.start()
    try:
        index.update(retained(deep))
        stored = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert stored < 200_000, stored
    assert [m.topic for m in index.matching("a/" * 15_999 + "+", NOW)] == [deep]
    assert [m.topic for m in index.matching("a/a/#", NOW)] == [deep]
    assert [m.topic for m in index.matching("a/+", NOW)] == ["a/other"]
    assert index.update(retained(deep, b"")) and index.node_count() == 1


@campaign(300, deadline=None)
@given(st.lists(DEEP_TOPICS, min_size=1, max_size=25), DEEP_FILTERS, st.integers(1, 6),
       st.lists(st.tuples(DEEP_TOPICS, st.booleans()), max_size=12))
def test_a_walk_paused_while_the_tree_changes_finds_no_stranger_and_loses_no_bystander(
    topics: list[str], topic_filter: str, steps: int, changes: list[tuple[str, bool]]
) -> None:
    """A new subscription's walk pauses between steps while other clients retain and delete topics,
    which splits and joins edges under it. What it finds must still match the filter, and every topic
    that stayed retained and untouched all along must be found."""
    index = RetainedMessages()
    for topic in topics:
        index.update(retained(topic))
    walk = index.matches(topic_filter)
    touched = set()
    for topic, delete in changes:
        walk.find(steps)
        index.update(retained(topic, b"" if delete else b"new"))
        touched.add(topic)
    walk.find(None)
    found = []
    while (message := walk.next()) is not None:
        found.append(message.topic)
    assert all(reference_matches(topic_filter, topic) for topic in found), found
    bystanders = {t for t in topics if t not in touched and reference_matches(topic_filter, t)}
    assert bystanders <= set(found)
    assert len(found) == len(set(found))


@pytest.mark.parametrize(
    ("topics", "change", "topic_filter"),
    [
        (["X/b/c", "X/z"], "X/b/d", "X/+"),  # an edge the walk is about to follow is split
        (["X/b", "X/b/c", "X/z"], "X/b", "X/+/c/c"),  # a node the walk stands on is joined into its child
        (["X/b", "X/b/c", "X/z"], "X/b", "X/+/c"),
    ],
)
def test_edges_split_or_joined_at_any_pause_of_a_walk(topics: list[str], change: str, topic_filter: str) -> None:
    for pause in range(12):
        index = RetainedMessages()
        for topic in topics:
            index.update(retained(topic))
        walk = index.matches(topic_filter)
        walk.find(pause)
        index.update(retained(change, b"" if change in topics else b"new"))
        walk.find(None)
        found = []
        while (message := walk.next()) is not None:
            found.append(message.topic)
        assert all(reference_matches(topic_filter, topic) for topic in found), (pause, found)
        untouched = [t for t in topics if t != change and reference_matches(topic_filter, t)]
        assert set(untouched) <= set(found), (pause, found)
