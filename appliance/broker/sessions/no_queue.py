"""``NO_QUEUE``: the queue of every session that has never queued anything.

A module of its own because it is the one class of the per-message path that mypyc cannot compile
(``bench/native_codec.py --core`` compiles that path to measure it, issue 30): a compiled subclass of
``deque`` crashes, and a class body may not bind several names at once. Here it stays interpreted while
the sessions module around it is compiled; compiled callers still reach its methods, which are looked up
on the object.
"""

from __future__ import annotations

from collections import deque

from appliance.broker.routing.delivery import Delivery


class _NoQueue(deque[Delivery]):
    """A deque costs 760 bytes even empty, and most sessions of a gateway (devices that only publish)
    never queue. Reading it is reading an empty deque; a write that would add to it raises instead of
    sharing a delivery between sessions: a session swaps in a deque of its own first
    (``Session._enqueue``)."""

    def _shared(self, *args: object) -> None:
        raise AssertionError("NO_QUEUE is shared: a session must give itself a deque before queuing")

    append = appendleft = extend = extendleft = insert = __iadd__ = _shared  # type: ignore[assignment]


NO_QUEUE: deque[Delivery] = _NoQueue()
