"""Retained messages: the last retained PUBLISH per topic, handed to new subscriptions.

Kept in memory (the store persists every change) in a tree with one level per topic level, so a new
subscription walks only the branches its filter can match: ``site/+/temp`` visits the children of
``site`` and one child of each, not every retained topic. A gateway holds thousands of retained topics
(device states, ``$SYS``) and clients subscribe with wildcards on every reconnect, so a linear scan per
subscription would grow with everything retained. Matches come back in the order their topics were first
retained, as the earlier dict-based scan returned them. An empty payload deletes (MQTT 5 3.3.1.3);
expired messages are dropped when they are next looked at.
"""

from __future__ import annotations

import itertools

from appliance.broker.message import Message


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
        """Retained messages whose topic matches ``topic_filter`` (unshared), oldest topic first."""
        found: list[_Level] = []
        levels = topic_filter.split("/")
        last = len(levels)
        stack: list[tuple[_Level, int]] = [(self._root, 0)]
        while stack:
            node, index = stack.pop()
            if index == last:
                if node.message is not None:
                    found.append(node)
                continue
            level = levels[index]
            if level == "#":  # this level and everything below it ("a/#" matches "a" too, 4.7.1.2)
                if node.message is not None and index:
                    found.append(node)
                self._collect(node, index == 0, found)
            elif level == "+":
                for name, child in node.children.items():
                    # MQTT 4.7.2: a filter starting with a wildcard never matches a topic starting with '$'.
                    if not (index == 0 and name.startswith("$")):
                        stack.append((child, index + 1))
            else:
                child = node.children.get(level)
                if child is not None:
                    stack.append((child, index + 1))
        found.sort(key=lambda matched: matched.order)
        messages: list[Message] = []
        expired: list[str] = []
        for node in found:
            message = node.message
            assert message is not None
            if message.expired(now):
                expired.append(message.topic)
            else:
                messages.append(message)
        for topic in expired:
            self._delete(topic)
        return messages

    @staticmethod
    def _collect(top: _Level, at_root: bool, found: list[_Level]) -> None:
        """Every level with a message below ``top`` (skipping ``$`` topics when ``top`` is the root)."""
        stack = [child for name, child in top.children.items() if not (at_root and name.startswith("$"))]
        while stack:
            node = stack.pop()
            if node.message is not None:
                found.append(node)
            stack.extend(node.children.values())

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
