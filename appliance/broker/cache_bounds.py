"""How the broker's caches keyed by what a client sends are bounded in bytes, not only in entries.

Why: a topic name (or client id) can be 65,535 bytes, so a cache bounded only by its entry count
(65,536) can hold about 4 GB of keys for a client that publishes distinct long topics, and a gateway has
1-4 GB. Every such cache therefore

* does not keep a key longer than ``MAX_CACHED_KEY_CHARS`` (1 KiB): the topics devices repeat are far
  shorter, so the common case is always cached, and a stream of long unique topics neither grows the
  cache nor flushes the short topics out of it (such a topic pays its uncached lookup, linear in its
  length like the decoding that came before);
* counts what it holds (its keys' characters plus an estimate of each entry's own objects) and starts
  over when that passes its byte budget, besides its entry cap.

The checks run only when an entry is added (a miss), never on a hit: the hot path is unchanged. Which
caches follow the rule, and their budgets, are listed in docs/broker-security.md (Resource limits).
"""

from __future__ import annotations

from typing import Generic, TypeVar

#: Keys longer than this (characters of a str, bytes of raw topic bytes) are looked up, never cached.
MAX_CACHED_KEY_CHARS = 1024

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """A broker-wide cache that follows the rule above. Hits read ``entries`` directly (a dict lookup, as
    without a bound); ``put`` applies the bound on a miss. (The reader's per-connection topic cache keeps
    the same rule inline, in two fields of its own: an object per connection would cost every idle
    connection's footprint.)"""

    __slots__ = ("entries", "max_entries", "max_bytes", "held_bytes")

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.entries: dict[K, V] = {}
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        #: Estimated bytes of ``entries``: each key's characters plus its entry's own estimate.
        self.held_bytes = 0

    def put(self, key: K, value: V, key_chars: int, entry_bytes: int) -> None:
        """Keep ``value`` for ``key`` unless the key is longer than ``MAX_CACHED_KEY_CHARS``; start over
        first if the entry cap or the byte budget would be passed."""
        if key_chars > MAX_CACHED_KEY_CHARS:
            return
        size = key_chars + entry_bytes
        if len(self.entries) >= self.max_entries or self.held_bytes + size > self.max_bytes:
            self.clear()
        self.entries[key] = value
        self.held_bytes += size

    def clear(self) -> None:
        self.entries.clear()
        self.held_bytes = 0
