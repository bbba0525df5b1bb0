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

#: Keys longer than this (characters of a str, bytes of raw topic bytes) are looked up, never cached.
MAX_CACHED_KEY_CHARS = 1024
