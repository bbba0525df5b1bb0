"""Retained messages: the last retained PUBLISH per topic, handed to new subscriptions.

Kept in memory (the store persists every change) in a tree with one level per topic level, so a new
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

from appliance.broker.message import Message

_FIRST_RETAINED = attrgetter("order")


class _Level:
    """One topic level: its children by name and, if a topic ends here, its retained message and the
    order in which that topic was first retained."""

    __slots__ = ("children", "message", "order")

    def __init__(self) -> None:
        self.children: dict[str, _Level] = {}
        self.message: Message | None = None
        self.order = 0


class RetainedMessages:
    def __init__(self) -> None:
        self._root = _Level()
        self._count = 0
        self._orders = itertools.count(1)

    def __len__(self) -> int:
        return self._count

    def update(self, message: Message) -> bool:
        """Store or (empty payload) delete the retained message of ``message.topic``; True if it changed."""
        if message.payload:
            node = self._root
            for level in message.topic.split("/"):
                child = node.children.get(level)
                if child is None:
                    child = node.children[level] = _Level()
                node = child
            if node.message is None:
                self._count += 1
                node.order = next(self._orders)
            node.message = message
            return True
        return self._delete(message.topic)

    def matching(self, topic_filter: str, now: float) -> list[Message]:
        """Retained messages whose topic matches ``topic_filter`` (unshared), oldest topic first; all at
        once (a new subscription takes them a slice at a time through ``matches``)."""
        found = self.matches(topic_filter)
        found.find(None)
        messages: list[Message] = []
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
        and None for every other level visited, so the caller can stop after any number of steps."""
        levels = topic_filter.split("/")
        last = len(levels)
        stack: list[tuple[_Level, int]] = [(self._root, 0)]
        while stack:
            node, index = stack.pop()
            if index == last:
                yield node if node.message is not None else None
                continue
            level = levels[index]
            if level == "#":  # this level and everything below it ("a/#" matches "a" too, 4.7.1.2)
                yield node if node.message is not None and index else None
                # MQTT 4.7.2: a filter starting with a wildcard never matches a topic starting with '$'.
                below = [child for name, child in node.children.items() if not (index == 0 and name.startswith("$"))]
                while below:
                    node = below.pop()
                    yield node if node.message is not None else None
                    below.extend(node.children.values())
            elif level == "+":
                # A copy: the walk pauses between steps, and the tree may change meanwhile.
                for name, child in list(node.children.items()):
                    yield None
                    if not (index == 0 and name.startswith("$")):
                        stack.append((child, index + 1))
            else:
                yield None
                child = node.children.get(level)
                if child is not None:
                    stack.append((child, index + 1))

    def _delete(self, topic: str) -> bool:
        path: list[tuple[_Level, str]] = []
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.message is None:
            return False
        node.message = None
        self._count -= 1
        for parent, level in reversed(path):  # prune levels left with nothing below them
            child = parent.children[level]
            if child.message is not None or child.children:
                break
            del parent.children[level]
        return True


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
        for visited, node in enumerate(itertools.islice(self._walk, steps), start=1):
            if node is not None:
                found.append(node)
        if steps is None or visited < steps:
            self.complete = True
            found.sort(key=_FIRST_RETAINED)
        return visited

    def next(self) -> Message | None:
        """The next match's message (once ``complete``); None when every match was taken."""
        found = self._found
        while self._position < len(found):
            node = found[self._position]
            self._position += 1
            if node.message is not None:
                return node.message
        return None
