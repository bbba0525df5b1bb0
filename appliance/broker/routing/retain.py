"""Retained messages: the last retained PUBLISH per topic, handed to new subscriptions.

Kept in memory (the store persists every change) in a tree by topic level (``edge_tree``: a chain of
levels no other topic shares is one node, so a deep topic costs what its text costs), so a new
subscription walks only the branches its filter can match: ``site/+/temp`` visits the children of
``site`` and one child of each, not every retained topic. A gateway holds thousands of retained topics
(device states, ``$SYS``) and clients subscribe with wildcards on every reconnect, so a linear scan per
subscription would grow with everything retained. Matches come back in the order their topics were first
retained, as the earlier dict-based scan returned them; ``matches`` finds and hands them out a few steps
at a time, for ``retained_feed``. An empty payload deletes (MQTT 5 3.3.1.3);
expired messages are dropped when they are next looked at.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from operator import attrgetter

from appliance.broker.routing import edge_tree
from appliance.broker.routing.edge_tree import EdgeNode
from appliance.broker.routing.message import BrokerMessage

_FIRST_RETAINED = attrgetter("order")


class _Level(EdgeNode):
    """Where topics end or branch (``edge_tree``): if a topic ends here, its retained message and the order
    in which that topic was first retained."""

    __slots__ = ("message", "order")

    def __init__(self, edge: str, span: int, depth: int) -> None:
        super().__init__(edge, span, depth)
        self.message: BrokerMessage | None = None
        self.order = 0

    def occupied(self) -> bool:
        return self.message is not None


class RetainedMessages:
    def __init__(self) -> None:
        self._root = _Level("", 0, 0)
        self._count = 0
        self._orders = itertools.count(1)

    def __len__(self) -> int:
        return self._count

    def update(self, message: BrokerMessage) -> bool:
        """Store or (empty payload) delete the retained message of ``message.topic``; True if it changed."""
        if message.payload:
            node = edge_tree.insert(self._root, message.topic.split("/"), _Level)
            if node.message is None:
                self._count += 1
                node.order = next(self._orders)
            node.message = message
            return True
        return self._delete(message.topic)

    def matching(self, topic_filter: str, now: float) -> list[BrokerMessage]:
        """Retained messages whose topic matches ``topic_filter`` (unshared), oldest topic first; all at
        once (a new subscription takes them a slice at a time through ``matches``)."""
        found = self.matches(topic_filter)
        found.find(None)
        messages: list[BrokerMessage] = []
        while (message := found.next()) is not None:
            if message.expired(now):
                self._delete(message.topic)
            else:
                messages.append(message)
        return messages

    def matches(self, topic_filter: str) -> RetainedMatches:
        """The retained messages matching ``topic_filter`` (unshared), to be found and taken in slices."""
        return RetainedMatches(self._walk(topic_filter))

    def _walk(self, topic_filter: str) -> Iterator[_Level | None]:
        """Visit the levels ``topic_filter`` can match, yielding each one that holds a matching message
        and None for every other one visited, so the caller can stop after any number of steps."""
        levels = topic_filter.split("/")
        last = len(levels)
        stack: list[tuple[_Level, int]] = [(self._root, 0)]  # (node, filter index after its edge)
        while stack:
            node, index = stack.pop()
            if index == last:
                yield node if node.message is not None else None
                continue
            level = levels[index]
            children = node.children
            if level == "#":  # this level and everything below it ("a/#" matches "a" too, 4.7.1.2)
                yield node if node.message is not None and index else None
                if children:
                    # MQTT 4.7.2: a filter starting with a wildcard never matches a topic starting with '$'.
                    yield from _below([c for name, c in children.items() if not (index == 0 and name.startswith("$"))])
            elif not children:
                yield None
            elif level == "+":
                # The names, taken now; each child as it is when its turn comes (the walk pauses between
                # steps and the tree may change meanwhile: ``edge_tree.EdgeNode``).
                for name in list(children):
                    yield None
                    child = node.children.get(name) if node.children else None
                    if child is not None and not (index == 0 and name.startswith("$")):
                        yield from _follow(child, levels, index, stack)
            else:
                yield None
                exact = children.get(level)
                if exact is not None:
                    yield from _follow(exact, levels, index, stack)

    def _delete(self, topic: str) -> bool:
        found = edge_tree.find(self._root, topic.split("/"))
        if found is None or found[1].message is None:
            return False
        path, node = found
        node.message = None
        self._count -= 1
        edge_tree.release(path, node)
        return True

    def node_count(self) -> int:
        """Nodes below the root (the tests check that deletions give them back)."""
        return edge_tree.count_nodes(self._root)


def _follow(child: _Level, levels: list[str], index: int, stack: list[tuple[_Level, int]]) -> Iterator[_Level | None]:
    """Match the rest of ``child``'s edge against the filter, its level at ``index`` already matched (by
    name); continue below it, or (a '#' reached inside the edge) yield it and everything below it.

    The edge starts at ``index`` unless the node the walk came from was joined into ``child`` while the
    walk paused: then its first ``index - start`` levels were matched on the way here already."""
    start = child.depth - child.span
    if child.depth - index > 1:
        edge = child.levels()
        for offset in range(index - start + 1, child.span):
            at = start + offset
            if at >= len(levels):
                return  # the filter ends inside the edge: every topic here is longer
            level = levels[at]
            if level == "#":
                yield from _below([child])
                return
            if level != "+" and level != edge[offset]:
                return
    stack.append((child, child.depth))


def _below(stack: list[_Level]) -> Iterator[_Level | None]:
    """Every level in ``stack`` and below it, those with a message yielded."""
    while stack:
        node = stack.pop()
        yield node if node.message is not None else None
        if node.children:
            stack.extend(node.children.values())


class RetainedMatches:
    """The retained messages matching one filter: found by walking the tree (``find``, as many steps at a
    time as the caller allows), then taken in the order their topics were first retained (``next``).

    A message is read from its level when it is taken, not when it was found: one deleted meanwhile is
    skipped, one replaced meanwhile is taken as it is now.
    """

    __slots__ = ("_walk", "_found", "_position", "complete")

    def __init__(self, walk: Iterator[_Level | None]) -> None:
        self._walk = walk
        self._found: list[_Level] = []
        self._position = 0
        self.complete = False

    def find(self, steps: int | None) -> int:
        """Walk on for at most ``steps`` levels (None: to the end); returns how many were visited."""
        visited = 0
        found = self._found
        for visited, node in enumerate(itertools.islice(self._walk, steps), start=1):  # noqa: B007  # read after
            if node is not None:
                found.append(node)
        if steps is None or visited < steps:
            self.complete = True
            found.sort(key=_FIRST_RETAINED)
        return visited

    def next(self) -> BrokerMessage | None:
        """The next match's message (once ``complete``); None when every match was taken."""
        found = self._found
        while self._position < len(found):
            node = found[self._position]
            self._position += 1
            if node.message is not None:
                return node.message
        return None
