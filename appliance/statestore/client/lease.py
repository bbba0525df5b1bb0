"""``Lease``: the protocol's active/standby example, a lock key whose version is the fencing token."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from appliance.blocking_clock import SYSTEM_CLOCK
from appliance.statestore.client.results import DeleteResult, GetResult, Notification, SetResult
from appliance.statestore.commands import Condition
from appliance.statestore.hlc import Hlc


class LeaseClient(Protocol):
    """What a lease asks of its client (``blocking.StateStoreClient`` is one): the four commands it uses."""

    def set(self, key: bytes, value: bytes, *, condition: Condition, expire_ms: int | None,
            timeout: float | None) -> SetResult: ...

    def get(self, key: bytes, *, timeout: float | None) -> GetResult: ...

    def vdelete(self, key: bytes, value: bytes, *, timeout: float | None) -> DeleteResult: ...

    def keynotify(self, key: bytes, callback: Callable[[Notification], None], *, timeout: float | None) -> None: ...

    def stop_keynotify(self, key: bytes, callback: Callable[[Notification], None] | None = None, *,
                       timeout: float | None = None) -> bool: ...


class Lease:
    """A lock key held with ``SET name holder NEX PX ttl``; ``fencing_token`` is its latest version."""

    def __init__(self, client: LeaseClient, name: bytes, holder: bytes, ttl_ms: int) -> None:
        self.client, self.name, self.holder, self.ttl_ms = client, name, holder, ttl_ms
        self.fencing_token: Hlc | None = None

    def acquire(self, *, wait: float = 0.0, timeout: float | None = None) -> bool:
        """True if this holder owns the lock now. With ``wait``, retry for that many seconds.

        Waiting is event-driven: the lock key is watched (KEYNOTIFY) and every change to it - a release or
        an expiry - triggers the next attempt, so a free lock is taken as soon as the store says so.
        """
        if self.renew(timeout=timeout) or wait <= 0:
            return self.fencing_token is not None
        changed = threading.Event()

        def on_change(note: Notification) -> None:
            changed.set()

        deadline = SYSTEM_CLOCK.monotonic() + wait
        self.client.keynotify(self.name, on_change, timeout=timeout)
        try:
            while True:
                changed.clear()  # before the attempt, so a change right after it is not missed
                if self.renew(timeout=timeout):
                    return True
                remaining = deadline - SYSTEM_CLOCK.monotonic()
                if remaining <= 0:
                    return False
                SYSTEM_CLOCK.wait(changed, remaining)
        finally:
            self.client.stop_keynotify(self.name, on_change, timeout=timeout)

    def renew(self, *, timeout: float | None = None) -> bool:
        """One ``SET name holder NEX PX ttl``: takes a free lock or extends ours; updates the token."""
        result = self.client.set(self.name, self.holder, condition=Condition.NEX, expire_ms=self.ttl_ms, timeout=timeout)
        self.fencing_token = result.version if result.applied else None
        return result.applied

    def current_holder(self, *, timeout: float | None = None) -> bytes | None:
        """Who holds the lock now (its value), or None if nobody does."""
        return self.client.get(self.name, timeout=timeout).value

    def release(self, *, timeout: float | None = None) -> bool:
        """Delete the lock only if this holder still owns it."""
        owned = self.client.vdelete(self.name, self.holder, timeout=timeout).count == 1
        self.fencing_token = None
        return owned
