"""``Lease.acquire(wait=...)`` (appliance/statestore/client/lease.py) on a fake clock: the waiting is
event-driven (a change of the lock key triggers the next attempt) and ends at the caller's deadline, both
read and waited for on the blocking clock port (``appliance/blocking_clock.py``), so no test sleeps."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from appliance.blocking_clock import BlockingClock
from appliance.statestore.client import lease as lease_module
from appliance.statestore.client.lease import Lease
from appliance.statestore.client.results import DeleteResult, GetResult, Notification, SetResult
from appliance.statestore.commands import Condition
from appliance.statestore.hlc import Hlc


class FakeClock(BlockingClock):
    """Time moves only when a wait runs out: a wait for an event not set takes exactly its timeout."""

    def __init__(self) -> None:
        self.time = 0.0
        self.waits: list[float | None] = []
        #: Run at the start of each wait (a change that arrives while the lease waits).
        self.during_wait: Callable[[], None] = lambda: None

    def monotonic(self) -> float:
        return self.time

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        self.waits.append(seconds)
        self.during_wait()
        if event.is_set():
            return True
        assert seconds is not None, "a lease never waits without a deadline"
        self.time += seconds
        return False


class LockKeys:
    """The four commands a lease uses, on one in-memory lock key, with KEYNOTIFY callbacks."""

    def __init__(self) -> None:
        self.holder: bytes | None = None
        self.version = 0
        self.watchers: list[Callable[[Notification], None]] = []
        self.sets = 0

    def set(self, key: bytes, value: bytes, *, condition: Condition, expire_ms: int | None,
            timeout: float | None) -> SetResult:
        self.sets += 1
        if self.holder not in (None, value):
            return SetResult(False, None)
        self.holder = value
        self.version += 1
        return SetResult(True, Hlc(self.version, 0, "n"))

    def get(self, key: bytes, *, timeout: float | None) -> GetResult:
        return GetResult(self.holder, None)

    def vdelete(self, key: bytes, value: bytes, *, timeout: float | None) -> DeleteResult:
        owned = self.holder == value
        if owned:
            self.release(key)
        return DeleteResult(1 if owned else -1, None)

    def release(self, key: bytes) -> None:
        self.holder = None
        for watcher in list(self.watchers):
            watcher(Notification(key, None, None))

    def keynotify(self, key: bytes, callback: Callable[[Notification], None], *, timeout: float | None) -> None:
        self.watchers.append(callback)

    def stop_keynotify(self, key: bytes, callback: Callable[[Notification], None] | None = None, *,
                       timeout: float | None = None) -> bool:
        self.watchers = [w for w in self.watchers if w is not callback]
        return True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(lease_module, "SYSTEM_CLOCK", fake)
    return fake


def test_a_held_lock_is_waited_for_until_the_deadline_on_the_clock(clock: FakeClock) -> None:
    keys = LockKeys()
    keys.holder = b"rival"
    assert not Lease(keys, b"lock", b"me", 1000).acquire(wait=5.0)
    assert clock.time == 5.0 and clock.waits == [5.0], "one wait for a change, cut short by the deadline"
    assert keys.watchers == [], "the watch ends with the wait"


def test_a_release_while_waiting_is_taken_at_once(clock: FakeClock) -> None:
    keys = LockKeys()
    keys.holder = b"rival"
    clock.during_wait = lambda: keys.release(b"lock")
    lease = Lease(keys, b"lock", b"me", 1000)
    assert lease.acquire(wait=5.0)
    assert clock.time == 0.0 and keys.sets == 3, "the release's notification, not the deadline, woke it"
    assert lease.fencing_token == Hlc(1, 0, "n")
