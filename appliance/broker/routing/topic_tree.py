"""Topic names, topic filters and the subscription tree that maps a published topic to its subscribers.

Why it is built this way:

* It is on the hot path of every PUBLISH, so it is pure (no I/O, no asyncio) and ``match`` caches its
  result per topic name. Devices publish on a small set of repeated topics, so after the first publish on
  ``site/7/temp`` the lookup is one dict hit. Every subscribe/unsubscribe bumps ``generation``; the cache
  is emptied lazily on the next ``match`` after a change, so a burst of SUBSCRIBEs costs one clear.
  The cache is bounded in bytes, not only in entries (``cache_bounds``): topic names over 1 KiB are not
  cached, and it starts over past ``MATCH_CACHE_BYTES`` of estimated size (keys and results).
* The tree only *finds* subscriptions. It does not merge overlapping ones, pick a shared-group member or
  apply no-local: those need the publisher and session state, so the router decides (MQTT 5 section
  3.3.4 allows one delivery per client with the highest QoS and every matching subscription identifier).
* Topic rules follow MQTT 5.0 section 4.7 (identical in 3.1.1 section 4.7): ``/`` separates levels,
  empty levels are allowed, ``+`` fills exactly one whole level, ``#`` is last and fills a whole level, no
  NUL, at most 65,535 UTF-8 bytes, and filters starting with a wildcard do not match topics starting
  with ``$`` (section 4.7.2).

Results returned by ``match`` are shared between calls (they live in the cache): treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.broker.cache_bounds import BoundedCache
from appliance.broker.routing import edge_tree
from appliance.broker.routing.edge_tree import EdgeNode

MAX_TOPIC_BYTES = 65535
#: Default of the broker's ``max_topic_levels``: deeper topic names and filters are refused.
DEFAULT_MAX_TOPIC_LEVELS = 128
SHARE_PREFIX = "$share/"
#: Cached topic names before the cache is emptied; bounds memory when topics are unique per message.
MATCH_CACHE_SIZE = 65536
#: Estimated bytes of cached matches (``cache_bytes``) before the cache is emptied: 65,536 short topics
#: matching nothing fit, ~30,000 matching one client each; keys over 1 KiB are never cached.
MATCH_CACHE_BYTES = 16 * 1024 * 1024
#: What one cached entry costs besides its key's characters (measured with tracemalloc): the dict slot and
#: the key's str header, a ``MatchResult`` with its dicts and first tuple...
MATCH_ENTRY_BYTES = 400
#: ... and each further matched client or shared-group member.
MATCH_SUBSCRIBER_BYTES = 100


class TopicError(ValueError):
    """A topic name or topic filter breaks MQTT 4.7 (PUBLISH: reason 0x90, SUBSCRIBE: reason 0x8F)."""


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """The per-subscription options of MQTT 5 SUBSCRIBE (3.8.3.1); 3.1.1 clients use the defaults but QoS.

    ``retain_handling``: 0 send retained messages at subscribe, 1 only if the subscription is new,
    2 never. ``subscription_identifier`` is None when the SUBSCRIBE carried none.
    """

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_identifier: int | None = None


@dataclass(frozen=True, slots=True)
class Subscription:
    """One client's subscription as the tree stores it.

    ``topic_filter`` is the filter exactly as the client sent it (with any ``$share/{group}/`` prefix): it
    is the key for UNSUBSCRIBE and for persistence. ``match_filter`` is the part that is matched against
    topic names, and ``share_group`` the group name of a shared subscription (None otherwise).
    """

    client_id: str
    topic_filter: str
    match_filter: str
    share_group: str | None
    options: SubscriptionOptions


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Everything that matches one topic name.

    ``subscribers``: client id -> every ordinary subscription of that client matching the topic (more than
    one when its filters overlap). ``shared``: (group, match_filter) -> the members of that shared
    subscription; the router delivers to one of them.
    """

    subscribers: dict[str, tuple[Subscription, ...]]
    shared: dict[tuple[str, str], tuple[Subscription, ...]]


NO_MATCH = MatchResult({}, {})


def validate_topic_name(topic: str) -> None:
    """Raise ``TopicError`` unless ``topic`` may be published to (no wildcards)."""
    if not topic:
        raise TopicError("topic name is empty")
    if "+" in topic or "#" in topic:
        raise TopicError(f"topic name {topic!r} contains a wildcard")
    _check_common(topic, "topic name")


def validate_topic_filter(topic_filter: str) -> None:
    """Raise ``TopicError`` unless ``topic_filter`` is a valid filter (without a ``$share`` prefix)."""
    if not topic_filter:
        raise TopicError("topic filter is empty")
    _check_common(topic_filter, "topic filter")
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != last):
            raise TopicError(f"topic filter {topic_filter!r}: '#' must be the whole last level")
        if "+" in level and level != "+":
            raise TopicError(f"topic filter {topic_filter!r}: '+' must be a whole level")


def split_shared(topic_filter: str) -> tuple[str | None, str]:
    """Validate a SUBSCRIBE filter and return (share group or None, filter to match).

    ``$share/{group}/{filter}``: the group is non-empty and has no ``/``, ``+`` or ``#`` (MQTT 5 4.8.2);
    the filter after it must itself be valid.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        validate_topic_filter(topic_filter)
        return None, topic_filter
    group, sep, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not sep or not inner:
        raise TopicError(f"shared subscription {topic_filter!r} needs the form $share/{{group}}/{{filter}}")
    if not group or "+" in group or "#" in group:
        raise TopicError(f"shared subscription {topic_filter!r}: bad share name {group!r}")
    validate_topic_filter(inner)
    return group, inner


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether one (valid, unshared) filter matches one topic name; for ACLs and retained messages."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == len(topic_levels)


def check_levels(text: str, max_levels: int, what: str) -> None:
    """Raise ``TopicError`` if ``text`` has more than ``max_levels`` levels; counts without splitting, so
    refusing a 64 KB string of ``/`` costs no allocation."""
    if text.count("/") >= max_levels:
        raise TopicError(f"{what} has more than {max_levels} levels")


def _check_common(text: str, what: str) -> None:
    if "\x00" in text:
        raise TopicError(f"{what} contains NUL")
    # A str of n characters encodes to at most 4n bytes, so short strings need no encoding to check.
    if len(text) * 4 > MAX_TOPIC_BYTES and len(text.encode("utf-8")) > MAX_TOPIC_BYTES:
        raise TopicError(f"{what} is longer than {MAX_TOPIC_BYTES} bytes")


class _Node(EdgeNode):
    """Where filters end or branch (``edge_tree``): the subscriptions of the filter that ends here. The
    full filter is kept once, in each ``Subscription``, never per node."""

    __slots__ = ("shared", "subscribers")

    def __init__(self, edge: str, span: int, depth: int) -> None:
        super().__init__(edge, span, depth)
        self.subscribers: dict[str, Subscription] | None = None
        self.shared: dict[str, dict[str, Subscription]] | None = None

    def occupied(self) -> bool:
        return bool(self.subscribers or self.shared)


class SubscriptionTree:
    """Every subscription of every session, indexed by filter level for ``match`` and by client id.

    A client has at most one subscription per ``topic_filter`` string (MQTT 3.8.4: a SUBSCRIBE with an
    existing filter replaces it). ``generation`` increases on every change. ``max_levels`` is the
    broker's ``max_topic_levels``: deeper filters are refused (docs/broker-security.md).
    """

    def __init__(self, max_levels: int = DEFAULT_MAX_TOPIC_LEVELS) -> None:
        self.max_levels = max_levels
        self._root = _Node("", 0, 0)
        self._by_client: dict[str, dict[str, Subscription]] = {}
        self.generation = 0
        self._cache: BoundedCache[str, MatchResult] = BoundedCache(MATCH_CACHE_SIZE, MATCH_CACHE_BYTES)
        self._cache_generation = 0

    def __len__(self) -> int:
        return sum(len(subs) for subs in self._by_client.values())

    def check(self, topic_filter: str) -> tuple[str | None, str]:
        """Validate a SUBSCRIBE filter, its depth included; (share group or None, filter to match)."""
        group, match_filter = split_shared(topic_filter)
        check_levels(match_filter, self.max_levels, "topic filter")
        return group, match_filter

    def subscribe(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> Subscription | None:
        """Add or replace a subscription; return the one it replaced (None if new: retain handling 1).

        Raises ``TopicError`` for an invalid or too deep filter, leaving the tree unchanged.
        """
        group, match_filter = self.check(topic_filter)
        subscription = Subscription(client_id, topic_filter, match_filter, group, options)
        node = edge_tree.insert(self._root, match_filter.split("/"), _Node)
        previous: Subscription | None
        if group is None:
            if node.subscribers is None:
                node.subscribers = {}
            previous = node.subscribers.get(client_id)
            node.subscribers[client_id] = subscription
        else:
            if node.shared is None:
                node.shared = {}
            members = node.shared.setdefault(group, {})
            previous = members.get(client_id)
            members[client_id] = subscription
        self._by_client.setdefault(client_id, {})[topic_filter] = subscription
        self.generation += 1
        return previous

    def unsubscribe(self, client_id: str, topic_filter: str) -> bool:
        """Remove one subscription; False if the client had none with that filter (UNSUBACK 0x11)."""
        client_subs = self._by_client.get(client_id)
        subscription = client_subs.pop(topic_filter, None) if client_subs else None
        if subscription is None:
            return False
        if not client_subs:
            del self._by_client[client_id]
        self._remove_from_tree(subscription)
        self.generation += 1
        return True

    def remove_client(self, client_id: str) -> int:
        """Remove every subscription of a client (session ended or expired); return how many."""
        client_subs = self._by_client.pop(client_id, None)
        if not client_subs:
            return 0
        for subscription in client_subs.values():
            self._remove_from_tree(subscription)
        self.generation += 1
        return len(client_subs)

    def count_of(self, client_id: str) -> int:
        return len(self._by_client.get(client_id, ()))

    def holds(self, client_id: str, topic_filter: str) -> bool:
        return topic_filter in self._by_client.get(client_id, ())

    def subscriptions_of(self, client_id: str) -> dict[str, Subscription]:
        """A copy of the client's subscriptions keyed by ``topic_filter``."""
        return dict(self._by_client.get(client_id, {}))

    def node_count(self) -> int:
        """Nodes below the root (what the tree costs; the tests check that removal gives them back)."""
        return edge_tree.count_nodes(self._root)

    def match(self, topic: str) -> MatchResult:
        """Every subscription matching a (valid) topic name; cached until the next change."""
        cache = self._cache
        if self._cache_generation != self.generation:
            cache.clear()
            self._cache_generation = self.generation
        else:
            cached = cache.entries.get(topic)
            if cached is not None:
                return cached
        result = self._walk(topic)
        size = MATCH_ENTRY_BYTES
        if result is not NO_MATCH:
            size += MATCH_SUBSCRIBER_BYTES * (len(result.subscribers) + sum(map(len, result.shared.values())))
        cache.put(topic, result, len(topic), size)
        return result

    @property
    def cache_bytes(self) -> int:
        """Estimated bytes held by the match cache (its keys' characters plus the ``MATCH_*_BYTES``
        estimates), for the metrics page."""
        return self._cache.held_bytes

    def _walk(self, topic: str) -> MatchResult:
        levels = topic.split("/")
        count = len(levels)
        found: list[_Node] = []
        # (node, index of the first topic level its children have to match)
        pending: list[tuple[_Node, int]] = [(self._root, 0)]
        while pending:
            node, index = pending.pop()
            children = node.children
            if index == count:
                found.append(node)
                # "a/#" also matches "a" (MQTT 4.7.1.2).
                parent_match = children.get("#") if children else None
                if parent_match is not None:
                    found.append(parent_match)
                continue
            if not children:
                continue
            # MQTT 4.7.2: a filter starting with '+' or '#' never matches a topic starting with '$'.
            if index or not topic.startswith("$"):
                multi = children.get("#")
                if multi is not None:
                    found.append(multi)
                single = children.get("+")
                if single is not None:
                    _follow(single, levels, index, pending, found)
            exact = children.get(levels[index])
            if exact is not None:
                _follow(exact, levels, index, pending, found)
        if not found:
            return NO_MATCH
        subscribers: dict[str, list[Subscription]] = {}
        shared: dict[tuple[str, str], tuple[Subscription, ...]] = {}
        for node in found:
            if node.subscribers:
                for client_id, subscription in node.subscribers.items():
                    existing = subscribers.get(client_id)
                    if existing is None:
                        subscribers[client_id] = [subscription]
                    else:
                        existing.append(subscription)
            if node.shared:
                for group, members in node.shared.items():
                    members_now = tuple(members.values())
                    shared[(group, members_now[0].match_filter)] = members_now
        if not subscribers and not shared:
            return NO_MATCH
        return MatchResult({client_id: tuple(subs) for client_id, subs in subscribers.items()}, shared)

    def _remove_from_tree(self, subscription: Subscription) -> None:
        found = edge_tree.find(self._root, subscription.match_filter.split("/"))
        assert found is not None
        path, node = found
        if subscription.share_group is None:
            assert node.subscribers is not None
            del node.subscribers[subscription.client_id]
        else:
            assert node.shared is not None
            members = node.shared[subscription.share_group]
            del members[subscription.client_id]
            if not members:
                del node.shared[subscription.share_group]
        edge_tree.release(path, node)


def _follow(child: _Node, levels: list[str], index: int, pending: list[tuple[_Node, int]], found: list[_Node]) -> None:
    """Match ``child``'s edge against the topic levels from ``index`` (its first level already matched)."""
    span = child.span
    if span > 1:
        count = len(levels)
        edge = child.levels()
        for offset in range(1, span):
            level = edge[offset]
            if level == "#":  # always an edge's last level; matches the rest, even nothing (4.7.1.2)
                found.append(child)
                return
            at = index + offset
            if at >= count or (level != "+" and level != levels[at]):
                return
    pending.append((child, index + span))
