"""The service with a store that has test hooks, behind the real broker and real paho clients.

* A commit held open (SQLite's own statement trace stops the store thread at ``COMMIT``) must block no
  other client, must not be acknowledged early, and must not reorder anything.
* A disk that fills up (SQLite's ``max_page_count``) must fail the request cleanly and leave nothing behind.
* An expired key must read as absent on the wire while the sweep provably has not run (the gateway's clock
  is moved past the deadline instead of waiting for it).
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.statestore.client import Notification, StatusError
from appliance.statestore.commands import GetCommand, SetCommand
from appliance.statestore.config import StateStoreConfig
from appliance.statestore.store import FILE_NAME, Quotas, StateStore
from tests.statestore.hosted import HostedGateway
from tests.statestore.raw_mqtt import TIMEOUT, RawClient


class ShiftedRuntime(AsyncioRuntime):
    """The production runtime with its wall clock ``shift_s`` ahead, moved by the test: the gateway's
    clock jumps to a deadline while the clients' clocks (and the loop's timers) stay where they are."""

    shift_s = 0.0

    def now(self) -> float:
        return super().now() + self.shift_s


class HeldCommitStore(StateStore):
    """While ``holding`` is set, every COMMIT waits (on the store thread, transaction open) until
    ``released`` is set: an fsync that takes as long as the test wants."""

    def __init__(self, data_dir: Path, node_id: str, quotas: Quotas, sync: str) -> None:
        super().__init__(data_dir, node_id, quotas, sync)
        self.holding = threading.Event()
        self.at_commit = threading.Event()
        self.released = threading.Event()
        self._db.set_trace_callback(self._on_statement)

    def _on_statement(self, statement: str) -> None:
        if statement == "COMMIT" and self.holding.is_set():
            self.at_commit.set()
            self.released.wait(TIMEOUT)


class FillableStore(StateStore):
    """``page_limit``, once the test sets it, caps the file with ``PRAGMA max_page_count`` at the next SET:
    a change that needs a new page then fails with SQLITE_FULL, as on a full disk."""

    def __init__(self, data_dir: Path, node_id: str, quotas: Quotas, sync: str) -> None:
        super().__init__(data_dir, node_id, quotas, sync)
        self.page_limit: int | None = None

    def set(self, *args: Any, **kwargs: Any) -> Any:
        if self.page_limit is not None:
            self._db.execute(f"PRAGMA max_page_count = {self.page_limit}")
        return super().set(*args, **kwargs)


class SweepWatchingStore(StateStore):
    """Sets ``swept_with_deadline`` when an expiry sweep ends with an entry still waiting for its deadline:
    the sweep has then computed its sleep from that deadline."""

    def __init__(self, data_dir: Path, node_id: str, quotas: Quotas, sync: str) -> None:
        super().__init__(data_dir, node_id, quotas, sync)
        self.swept_with_deadline = threading.Event()

    def next_expiry(self) -> int | None:
        due = super().next_expiry()
        if due is not None:
            self.swept_with_deadline.set()
        return due


def stored_row(data_dir: Path, key: bytes) -> tuple[bytes] | None:
    """Read the file as a second connection would (WAL readers never wait for the writer)."""
    with closing(sqlite3.connect(data_dir / FILE_NAME)) as db:
        return db.execute("SELECT value FROM entries WHERE key = ?", (key,)).fetchone()


def test_a_held_commit_blocks_no_other_client_and_is_acknowledged_only_after_it(tmp_path: Path) -> None:
    with HostedGateway(tmp_path, StateStoreConfig(sync="full"), store_factory=HeldCommitStore) as gateway:
        store = gateway.store
        assert isinstance(store, HeldCommitStore)
        writer, reader = gateway.client("writer"), gateway.client("reader")
        plain = RawClient(gateway.host, gateway.port)
        try:
            plain.subscribe("plain/topic")
            store.holding.set()
            pending_set = writer.submit(SetCommand(b"k", b"v").encode())
            assert store.at_commit.wait(TIMEOUT)

            plain.publish("plain/topic", b"round trip")  # QoS 1, through the same broker loop
            assert plain.next_message().payload == b"round trip"
            assert stored_row(tmp_path, b"k") is None  # still not committed...
            assert not pending_set.done()  # ...so not acknowledged either
            pending_get = reader.submit(GetCommand(b"k").encode())  # waits its turn, then sees the commit

            store.holding.clear()
            store.released.set()
            assert pending_set.result(TIMEOUT).payload == b"+OK\r\n"
            assert pending_get.result(TIMEOUT).payload == b"$1\r\nv\r\n"
        finally:
            plain.close()


def test_responses_and_notifications_keep_change_order(tmp_path: Path) -> None:
    with HostedGateway(tmp_path, store_factory=HeldCommitStore) as gateway:
        store = gateway.store
        assert isinstance(store, HeldCommitStore)
        watcher = gateway.client("watcher")
        notes: queue.Queue[Notification] = queue.Queue()
        watcher.keynotify(b"k", notes.put)
        writers = [gateway.client(name) for name in ("a", "b")]
        store.holding.set()  # let both writers' pipelines pile up behind the first commit
        sent = [
            (writer.submit(SetCommand(b"k", f"{writer.client_id}{i}".encode()).encode()), f"{writer.client_id}{i}".encode())
            for i in range(40)
            for writer in writers
        ]
        assert store.at_commit.wait(TIMEOUT)
        store.holding.clear()
        store.released.set()
        committed = []
        for future, value in sent:
            response = future.result(TIMEOUT)
            assert response.payload == b"+OK\r\n"
            committed.append((response.version, value))
        for writer in writers:  # each client's own requests took effect in the order it sent them
            own = [version for version, value in committed if value.startswith(writer.client_id.encode())]
            assert own == sorted(own)
        received = [notes.get(timeout=TIMEOUT) for _ in committed]
        assert [(note.version, note.value) for note in received] == sorted(committed)
        assert watcher.get(b"k").value == max(committed)[1]


def test_a_full_disk_fails_the_request_cleanly_and_recovery_needs_no_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with HostedGateway(tmp_path, store_factory=FillableStore) as gateway:
        store = gateway.store
        assert isinstance(store, FillableStore)
        client, watcher = gateway.client("filler"), gateway.client("watcher")
        notes: queue.Queue[Notification] = queue.Queue()
        watcher.keynotify(b"big", notes.put)
        assert client.set(b"small", b"x").applied
        before = (store.key_count, store.total_bytes, store.clock.last)

        store.page_limit = 1  # SQLite raises it to the current size: the file may not grow any more
        with caplog.at_level(logging.DEBUG, logger="appliance.statestore.service"):
            for _ in range(20):
                with pytest.raises(StatusError) as failed:
                    client.set(b"big", b"x" * 200_000)
                assert failed.value.status == "500" and "storage failure" in failed.value.message
        # The client and key of each failure at debug level; the failing store once, not once per request.
        assert any("'filler'" in r.getMessage() and "b'big'" in r.getMessage() for r in caplog.records
                   if r.levelno == logging.DEBUG)
        # The state store's own lines: a neighbour's stray log record (another test's, collected now) is not its.
        [failing] = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("appliance.statestore")]
        assert failing.levelno == logging.ERROR and str(tmp_path / FILE_NAME) in failing.getMessage()
        assert "database or disk is full" in failing.getMessage() and gateway.service.health.disk_full

        assert client.get(b"big").value is None  # nothing half-applied: not in the file...
        assert stored_row(tmp_path, b"big") is None
        assert (store.key_count, store.total_bytes, store.clock.last) == before  # ...nor in memory
        assert client.get(b"small").value == b"x"  # reads still work

        store.page_limit = 1_000_000  # the cause is gone
        applied = client.set(b"big", b"y" * 200_000)
        assert applied.applied and gateway.service.health.healthy
        first = notes.get(timeout=TIMEOUT)  # the failed SET notified nobody
        assert (first.value, first.version) == (b"y" * 200_000, applied.version)
        with closing(sqlite3.connect(tmp_path / FILE_NAME)) as db:
            assert db.execute("SELECT COUNT(*), SUM(LENGTH(key) + LENGTH(value)) FROM entries").fetchone() == (
                store.key_count, store.total_bytes,
            )


def test_an_expired_key_reads_absent_on_the_wire_before_the_sweep_removes_it(tmp_path: Path) -> None:
    runtime = ShiftedRuntime()
    config = StateStoreConfig(sweep_interval_ms=3_600_000)  # the sweep sleeps until the deadline (or an hour)
    with HostedGateway(tmp_path, config, SweepWatchingStore, runtime) as gateway:
        store = gateway.store
        assert isinstance(store, SweepWatchingStore)
        client, watcher = gateway.client("setter"), gateway.client("watcher")
        notes: queue.Queue[Notification] = queue.Queue()
        watcher.keynotify(b"k", notes.put)
        assert client.set(b"k", b"v", expire_ms=600_000).applied
        assert notes.get(timeout=TIMEOUT).value == b"v"
        assert store.swept_with_deadline.wait(TIMEOUT)  # the SET woke the sweep; it now sleeps ~10 minutes

        runtime.shift_s = 600.0  # the gateway's clock is at the deadline: the key has expired
        assert client.request(GetCommand(b"k").encode()).payload == b"$-1\r\n"
        assert stored_row(tmp_path, b"k") == (b"v",)  # the sweep has not run: the row is still in the file
        assert notes.empty()

        assert client.set(b"other", b"w", expire_ms=600_000).applied  # wakes the sweep
        deleted = notes.get(timeout=TIMEOUT)
        assert (deleted.key, deleted.value) == (b"k", None)
        assert stored_row(tmp_path, b"k") is None
