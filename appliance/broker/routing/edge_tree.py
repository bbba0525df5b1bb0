"""Trees keyed by topic levels in which a chain of levels that nothing else shares is one node.

The subscription tree (filters) and the retained messages (topic names) are both trees by topic level.
One node per level costs a Python object and a dict per level, a few hundred bytes: a 16,000-level
filter or topic would cost megabytes from a 16 KB packet. Here a node's ``edge`` holds the levels from
its parent to it, joined by ``/`` (``span`` of them), so a tree costs about what its keys' text costs;
a node is split where a new key leaves its edge and joined with its only child when the last entry
between them goes. Each tree's walk (``match``, retained ``_walk``) compares edges level by level
itself: only insertion, lookup and removal are shared here. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Self, TypeVar


class EdgeNode:
    """A node and the edge that leads to it; ``children`` is keyed by the first level of each child's
    edge and created when first needed. Subclasses say what an entry at the node is (``occupied``).

    ``depth`` is the number of levels from the root to the end of the edge. Splits and joins move where an
    edge starts, never where it ends, so a walk that pauses between steps (retained messages for a new
    subscription) can tell from ``depth - span`` where a node's edge starts now.
    """

    __slots__ = ("children", "depth", "edge", "span")

    def __init__(self, edge: str, span: int, depth: int) -> None:
        self.edge = edge
        self.span = span
        self.depth = depth
        self.children: dict[str, Self] | None = None

    def levels(self) -> list[str]:
        return self.edge.split("/") if self.span > 1 else [self.edge]

    def occupied(self) -> bool:
        raise NotImplementedError


N = TypeVar("N", bound=EdgeNode)
Path = list[tuple[N, str]]


def insert(root: N, levels: list[str], make: Callable[[str, int, int], N]) -> N:
    """The node where ``levels`` end, splitting an edge (``make`` builds the new nodes) or adding one."""
    count = len(levels)
    node = root
    index = 0
    while index < count:
        if node.children is None:
            node.children = {}
        child = node.children.get(levels[index])
        if child is None:
            child = make("/".join(levels[index:]) if count - index > 1 else levels[index], count - index, count)
            node.children[levels[index]] = child
            return child
        edge = child.levels()
        common = 1
        while common < child.span and index + common < count and edge[common] == levels[index + common]:
            common += 1
        if common < child.span:
            # The key leaves (or ends inside) this edge: split it where they part.
            middle = make("/".join(edge[:common]), common, index + common)
            child.edge = "/".join(edge[common:])
            child.span -= common
            middle.children = {edge[common]: child}
            node.children[levels[index]] = middle
            child = middle
        node = child
        index += common
    return node


def find(root: N, levels: list[str]) -> tuple[Path[N], N] | None:
    """The node where exactly ``levels`` end and the (parent, key) pairs leading to it; None if there is
    none (its levels would end inside an edge, or leave the tree)."""
    path: Path[N] = []
    node = root
    index = 0
    count = len(levels)
    while index < count:
        child = node.children.get(levels[index]) if node.children else None
        if child is None or index + child.span > count:
            return None
        if child.span > 1 and child.levels() != levels[index : index + child.span]:
            return None
        path.append((node, levels[index]))
        node = child
        index += child.span
    return path, node


def release(path: Path[N], node: N) -> None:
    """``node`` lost its last entry: give it back, or join it with its only child; a parent left with
    no entry and one child is joined with that child. ``path`` leads to ``node`` (``find``)."""
    if node.occupied() or not path:
        return
    parent, key = path[-1]
    assert parent.children is not None
    if not node.children:
        del parent.children[key]
        if len(path) > 1 and len(parent.children) == 1 and not parent.occupied():
            grandparent, parent_key = path[-2]
            assert grandparent.children is not None
            grandparent.children[parent_key] = _joined(parent, next(iter(parent.children.values())))
    elif len(node.children) == 1:
        parent.children[key] = _joined(node, next(iter(node.children.values())))


def count_nodes(root: EdgeNode) -> int:
    """Nodes below ``root``: what the tree costs (tests check that removals give them back)."""
    count = 0
    stack = [root]
    while stack:
        node = stack.pop()
        if node.children:
            count += len(node.children)
            stack.extend(node.children.values())
    return count


def _joined(upper: N, lower: N) -> N:
    """``lower`` taking the place of ``upper``, a node without an entry and with one child (``upper`` keeps
    its child: a paused walk standing on it still finds ``lower``, and knows from its depth where its
    edge starts now)."""
    lower.edge = f"{upper.edge}/{lower.edge}"
    lower.span += upper.span
    return lower
