"""Admission of password checks, so that PBKDF2 cannot be turned into a denial of service.

A check of an unproven password costs about 0.15 s of CPU (210,000 PBKDF2-SHA512 rounds), so checks that
nobody bounds let a flood of wrong-password CONNECTs delay every legitimate login by tens of seconds
(bench/RESULTS.md, "Moved from docstrings").

Rules
-----
* **Bounded concurrency.** ``CHECK_SLOTS`` checks run at once; the others wait their turn in arrival
  order, at most ``MAX_WAITING`` of them (beyond that: CONNACK 0x89 Server busy).
* **A check nobody waits for is skipped.** When a waiting check's turn comes and its client has closed the
  connection, it is not run (``skipped`` counts them). A check already running cannot be interrupted
  (PBKDF2 holds its thread); its result is thrown away.
* **Failures are rate limited per source address** (an IPv4 address, an IPv6 /64, which is what one host
  gets): a token bucket of ``FAILURE_BURST`` tokens refilled at ``FAILURE_REFILL_PER_SECOND``. Every check
  takes a token when it is admitted and a check that succeeds gives it back, so what the bucket limits is
  failed and still pending checks. An address without a token is refused at once, without hashing:
  CONNACK 0x9F Connection rate exceeded (MQTT 5 section 3.2.2.2; MQTT 3.1.1 has no such code and gets 3,
  Server unavailable: a temporary condition, where 4 or 5 would tell the device that its credentials are
  wrong).
* The table holds at most ``MAX_ADDRESSES`` addresses; the least recently seen one is forgotten first (it
  comes back with a full bucket, so memory stays bounded and a flood that keeps going keeps its own empty
  bucket).

Theory of operation
-------------------
Pure: time comes in as arguments; waiting is a ``wake`` callback the caller supplies with its place in the
queue (``handlers.connect`` passes a runtime future's ``set_result``).
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from appliance.broker.codec import reasons as rc

CHECK_SLOTS = 2
MAX_WAITING = 32
FAILURE_BURST = 10
FAILURE_REFILL_PER_SECOND = 0.5
MAX_ADDRESSES = 4096

Wake = Callable[[], None]


def source_key(peer: str) -> str:
    """The rate-limited unit of a ``host:port`` peer: the IPv4 address, or the IPv6 /64."""
    host = peer.rpartition(":")[0].strip("[]") or peer
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return host


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class LoginGate:
    """Slots and per-address buckets for password checks; one per broker, kept across SIGHUP."""

    def __init__(
        self,
        slots: int = CHECK_SLOTS,
        max_waiting: int = MAX_WAITING,
        burst: int = FAILURE_BURST,
        refill_per_second: float = FAILURE_REFILL_PER_SECOND,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self.burst = burst
        self.refill_per_second = refill_per_second
        self.max_addresses = max_addresses
        self.running = 0
        #: Checks admitted and not yet at ``enter`` (their coroutine has not run yet, or sleeps a flap
        #: delay): many CONNECTs read in one loop turn are all admitted before the first one enters.
        self.admitted = 0
        #: Checks not run because their client had gone when their turn came.
        self.skipped = 0
        self._waiting: deque[Wake] = deque()
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    # -- per-address rate --------------------------------------------------------------------------------

    def admit(self, peer: str, now: float) -> int | None:
        """Take a token for a check from ``peer``: None if admitted, else the MQTT 5 reason to refuse with."""
        if self.admitted + len(self._waiting) >= self.max_waiting:
            return rc.SERVER_BUSY
        bucket = self._bucket(source_key(peer), now)
        if bucket.tokens < 1.0:
            return rc.CONNECTION_RATE_EXCEEDED
        bucket.tokens -= 1.0
        self.admitted += 1
        return None

    def succeeded(self, peer: str, now: float) -> None:
        """A check from ``peer`` accepted its password: its token goes back."""
        bucket = self._bucket(source_key(peer), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + 1.0)

    def _bucket(self, key: str, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_addresses:
                self._buckets.popitem(last=False)
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.refill_per_second)
            bucket.updated = now
        return bucket

    @property
    def addresses(self) -> int:
        return len(self._buckets)

    # -- slots ---------------------------------------------------------------------------------------

    def enter(self, wake: Wake) -> bool:
        """An admitted check asks for its slot. True: taken now. False: queued; ``wake()`` is called when
        the slot is handed over."""
        self.admitted -= 1
        if self.running < self.slots:
            self.running += 1
            return True
        self._waiting.append(wake)
        return False

    def leave(self) -> None:
        """A check ended (or was skipped): its slot passes to the first waiter, or becomes free."""
        if self._waiting:
            self._waiting.popleft()()
        else:
            self.running -= 1

    def abandon(self, wake: Wake) -> None:
        """The waiter behind ``wake`` is gone (its task was cancelled): drop it from the queue, or, if the
        slot had already been handed to it, pass the slot on."""
        try:
            self._waiting.remove(wake)
        except ValueError:
            self.leave()

    @property
    def waiting(self) -> int:
        return len(self._waiting)
