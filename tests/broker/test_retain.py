"""The retained-message index against the obvious reference: a list scanned with the regex-based matcher
of ``test_topic_tree``, in the order topics were first retained. Hypothesis builds many retained topics
(sharing prefixes, with ``$`` and empty levels), deletes and expires some, and checks every filter."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.broker.message import Message
from appliance.broker.retain import RetainedMessages
from tests.broker.test_topic_tree import reference_matches

NOW = 1_000_000.0
NAMES = st.sampled_from(["a", "b", "c", "", "$SYS", "$x", "sensor"])
TOPICS = st.lists(NAMES, min_size=1, max_size=4).map("/".join).filter(bool)
FILTER_LEVELS = st.one_of(NAMES, st.just("+"))
FILTERS = st.tuples(st.lists(FILTER_LEVELS, min_size=1, max_size=4), st.booleans()).map(
    lambda parts: "/".join(parts[0] + (["#"] if parts[1] else []))
).filter(bool) | st.just("#")


def retained(topic: str, payload: bytes = b"v", expires_at: float | None = None) -> Message:
    return Message(topic, payload, 1, True, {}, "origin", expires_at)


# (topic, action): 0 retain, 1 delete (empty payload), 2 retain already expired
OPERATIONS = st.lists(st.tuples(TOPICS, st.sampled_from([0, 0, 0, 1, 2])), max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPERATIONS, st.lists(FILTERS, min_size=1, max_size=8))
def test_matching_equals_a_scan_of_every_retained_topic(operations: list[tuple[str, int]], filters: list[str]) -> None:
    index = RetainedMessages()
    reference: dict[str, Message] = {}  # insertion-ordered, like the scan it replaced
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
