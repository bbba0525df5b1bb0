"""Topic validation and the subscription tree, checked against a naive regex-based reference matcher."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.routing.topic_tree import (
    MAX_TOPIC_BYTES,
    NO_MATCH,
    SubscriptionOptions,
    SubscriptionTree,
    TopicError,
    split_shared,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)
from testing.campaigns import campaign

QOS1 = SubscriptionOptions(qos=1)


def reference_matches(topic_filter: str, topic: str) -> bool:
    """MQTT 4.7 written the slow, obvious way: the filter becomes a regular expression."""
    if topic.startswith("$") and topic_filter[0] in "+#":
        return False
    levels = topic_filter.split("/")
    if levels[-1] == "#":
        prefix = [re.escape(level) if level != "+" else "[^/]*" for level in levels[:-1]]
        pattern = ".*" if not prefix else "/".join(prefix) + "(/.*)?"
    else:
        pattern = "/".join(re.escape(level) if level != "+" else "[^/]*" for level in levels)
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


@pytest.mark.parametrize(
    "topic",
    ["a", "/", "a/b/c", "a//b", "$SYS/broker/uptime", "sport/tennis player1", "é/日本", "x" * MAX_TOPIC_BYTES],
)
def test_valid_topic_names(topic: str) -> None:
    validate_topic_name(topic)


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        ("", "empty"),
        ("a/+", "wildcard"),
        ("a/#", "wildcard"),
        ("a+b", "wildcard"),
        ("a\x00b", "NUL"),
        ("x" * (MAX_TOPIC_BYTES + 1), "longer"),
        ("é" * (MAX_TOPIC_BYTES // 2 + 1), "longer"),  # 2 bytes per character in UTF-8
    ],
)
def test_invalid_topic_names(topic: str, reason: str) -> None:
    with pytest.raises(TopicError, match=reason):
        validate_topic_name(topic)


@pytest.mark.parametrize("topic_filter", ["#", "+", "a/#", "+/+", "/+", "a/+/c", "a//#", "+/#", "$SYS/#", "a/b"])
def test_valid_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize("topic_filter", ["", "a/#/b", "a#", "#/", "a/b#", "a+", "+a/b", "a/++", "a\x00"])
def test_invalid_filters(topic_filter: str) -> None:
    with pytest.raises(TopicError):
        validate_topic_filter(topic_filter)


def test_split_shared() -> None:
    assert split_shared("a/+") == (None, "a/+")
    assert split_shared("$share/g1/a/#") == ("g1", "a/#")
    assert split_shared("$share/g/#") == ("g", "#")
    for bad in ["$share/g", "$share/g/", "$share//a", "$share/g+/a", "$share/g#/a", "$share/g/a/#/b"]:
        with pytest.raises(TopicError):
            split_shared(bad)


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/#", "sport", True),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("#", "$SYS/uptime", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/monitor/Clients", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("a/b", "a/b/c", False),
    ],
)
def test_topic_matches_spec_examples(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected
    assert reference_matches(topic_filter, topic) is expected
    tree = SubscriptionTree()
    tree.subscribe("c", topic_filter, QOS1)
    assert ("c" in tree.match(topic).subscribers) is expected


def test_overlapping_subscriptions_all_reported_for_the_router() -> None:
    tree = SubscriptionTree()
    tree.subscribe("c", "a/+", SubscriptionOptions(qos=0, subscription_identifier=1))
    tree.subscribe("c", "a/#", SubscriptionOptions(qos=2, subscription_identifier=2))
    tree.subscribe("d", "a/b", QOS1)
    result = tree.match("a/b")
    assert sorted(sub.options.subscription_identifier for sub in result.subscribers["c"]) == [1, 2]
    assert [sub.topic_filter for sub in result.subscribers["d"]] == ["a/b"]


def test_shared_subscriptions_grouped_by_group_and_filter() -> None:
    tree = SubscriptionTree()
    tree.subscribe("c1", "$share/g/a/+", QOS1)
    tree.subscribe("c2", "$share/g/a/+", QOS1)
    tree.subscribe("c3", "$share/h/a/+", QOS1)
    tree.subscribe("c1", "$share/g/a/#", QOS1)
    tree.subscribe("c4", "a/b", QOS1)
    result = tree.match("a/b")
    assert {key: sorted(s.client_id for s in members) for key, members in result.shared.items()} == {
        ("g", "a/+"): ["c1", "c2"],
        ("h", "a/+"): ["c3"],
        ("g", "a/#"): ["c1"],
    }
    assert list(result.subscribers) == ["c4"]
    member = result.shared[("g", "a/+")][0]
    assert member.topic_filter == "$share/g/a/+" and member.share_group == "g" and member.match_filter == "a/+"


def test_subscribe_replaces_and_returns_previous() -> None:
    tree = SubscriptionTree()
    assert tree.subscribe("c", "a/#", SubscriptionOptions(qos=0)) is None
    previous = tree.subscribe("c", "a/#", SubscriptionOptions(qos=2))
    assert previous is not None and previous.options.qos == 0
    (only,) = tree.match("a/x").subscribers["c"]
    assert only.options.qos == 2
    assert len(tree) == 1


def test_invalid_filter_leaves_tree_unchanged() -> None:
    tree = SubscriptionTree()
    generation = tree.generation
    with pytest.raises(TopicError):
        tree.subscribe("c", "a/#/b", QOS1)
    assert tree.generation == generation and len(tree) == 0


def test_unsubscribe_and_remove_client_prune_the_tree() -> None:
    tree = SubscriptionTree()
    tree.subscribe("c", "a/b/c", QOS1)
    tree.subscribe("c", "$share/g/a/b/c", QOS1)
    tree.subscribe("d", "a/+/c", QOS1)
    assert tree.unsubscribe("c", "a/b/c") is True
    assert tree.unsubscribe("c", "a/b/c") is False
    assert tree.unsubscribe("nobody", "a/b/c") is False
    assert list(tree.match("a/b/c").subscribers) == ["d"]
    assert tree.remove_client("d") == 1
    assert tree.remove_client("c") == 1
    assert tree.match("a/b/c") is NO_MATCH
    assert tree._root.children == {}  # no empty branches left behind
    assert tree.subscriptions_of("c") == {}


def test_match_cache_is_invalidated_by_any_change() -> None:
    tree = SubscriptionTree()
    tree.subscribe("c", "a/+", QOS1)
    first = tree.match("a/b")
    assert tree.match("a/b") is first  # served from the cache
    tree.subscribe("d", "a/#", QOS1)
    assert set(tree.match("a/b").subscribers) == {"c", "d"}
    tree.unsubscribe("c", "a/+")
    assert set(tree.match("a/b").subscribers) == {"d"}
    tree.remove_client("d")
    assert tree.match("a/b") is NO_MATCH


LEVELS = st.sampled_from(["a", "b", "", "$x"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join).filter(bool)
FILTER_LEVELS = st.sampled_from(["a", "b", "", "+", "$x"])
FILTERS = st.builds(
    lambda levels, multi: "/".join(levels + ["#"] if multi else levels) or "#",
    st.lists(FILTER_LEVELS, min_size=0, max_size=3),
    st.booleans(),
).filter(bool)
SUBSCRIPTIONS = st.lists(
    st.tuples(st.sampled_from(["c1", "c2", "c3"]), FILTERS, st.sampled_from([None, "g1", "g2"])), max_size=12
)


def naive_match(subscriptions: dict[tuple[str, str], str | None], topic: str) -> tuple[dict, dict]:
    ordinary: dict[str, set[str]] = {}
    shared: dict[tuple[str, str], set[str]] = {}
    for (client_id, full_filter), group in subscriptions.items():
        match_filter = full_filter if group is None else full_filter.split("/", 2)[2]
        if reference_matches(match_filter, topic):
            if group is None:
                ordinary.setdefault(client_id, set()).add(full_filter)
            else:
                shared.setdefault((group, match_filter), set()).add(client_id)
    return ordinary, shared


def tree_match(tree: SubscriptionTree, topic: str) -> tuple[dict, dict]:
    result = tree.match(topic)
    ordinary = {client_id: {sub.topic_filter for sub in subs} for client_id, subs in result.subscribers.items()}
    shared = {key: {sub.client_id for sub in members} for key, members in result.shared.items()}
    return ordinary, shared


def subscribe(tree: SubscriptionTree, live: dict[tuple[str, str], str | None], client_id: str, match_filter: str,
              group: str | None) -> None:
    """``client_id`` subscribes to ``match_filter`` (in shared ``group``, if one), in the tree and in ``live``,
    the reference's record of what is subscribed."""
    full = match_filter if group is None else f"$share/{group}/{match_filter}"
    tree.subscribe(client_id, full, QOS1)
    live[(client_id, full)] = group


@campaign(300, deadline=None)
@given(SUBSCRIPTIONS, st.lists(TOPICS, min_size=1, max_size=6), st.data())
def test_tree_agrees_with_reference_matcher(subscriptions, topics, data) -> None:
    tree = SubscriptionTree()
    live: dict[tuple[str, str], str | None] = {}
    for client_id, match_filter, group in subscriptions:
        subscribe(tree, live, client_id, match_filter, group)
        # Interleave matches with changes so stale cache entries would show.
        topic = data.draw(st.sampled_from(topics))
        assert tree_match(tree, topic) == naive_match(live, topic)
    for topic in topics:
        assert tree_match(tree, topic) == naive_match(live, topic)
    removals = data.draw(st.lists(st.sampled_from(sorted(live)), unique=True)) if live else []
    for client_id, full in removals:
        assert tree.unsubscribe(client_id, full)
        del live[(client_id, full)]
        for topic in topics:
            assert tree_match(tree, topic) == naive_match(live, topic)
    assert len(tree) == len(live)


@campaign(300, deadline=None)
@given(FILTERS, TOPICS)
def test_topic_matches_agrees_with_reference(topic_filter: str, topic: str) -> None:
    assert topic_matches(topic_filter, topic) == reference_matches(topic_filter, topic)


DEEP_FILTERS = st.builds(
    lambda levels, multi: "/".join(levels + ["#"] if multi else levels) or "#",
    st.lists(FILTER_LEVELS, min_size=0, max_size=7),
    st.booleans(),
).filter(bool)
DEEP_TOPICS = st.lists(LEVELS, min_size=1, max_size=8).map("/".join).filter(bool)


@campaign(300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["c1", "c2", "c3"]), DEEP_FILTERS, st.sampled_from([None, None, "g1"])),
                max_size=16),
       st.lists(DEEP_TOPICS, min_size=1, max_size=6), st.data())
def test_compressed_edges_split_and_join_without_changing_what_matches(subscriptions, topics, data) -> None:
    """Deeper filters than above, so chains of levels are stored as one edge, split by later filters and
    joined again by removals: matching agrees with the reference at every step, and removing every
    subscription gives every node back."""
    tree = SubscriptionTree()
    live: dict[tuple[str, str], str | None] = {}
    for client_id, match_filter, group in subscriptions:
        subscribe(tree, live, client_id, match_filter, group)
    for topic in topics:
        assert tree_match(tree, topic) == naive_match(live, topic)
    order = data.draw(st.permutations(sorted(live)))
    for client_id, full in order:
        assert tree.unsubscribe(client_id, full)
        del live[(client_id, full)]
        topic = data.draw(st.sampled_from(topics))
        assert tree_match(tree, topic) == naive_match(live, topic)
    assert tree.node_count() == 0
