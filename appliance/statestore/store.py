"""The durable key-value store behind the state store protocol: SQLite in WAL mode, one file.

Why it is built this way:

* **Commit before reply.** Every change runs in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` and the caller only
  gets its outcome after the commit, so the service never answers ``+OK``/``:1`` for something a crash can
  take back. ``sync="normal"`` (WAL + ``synchronous=NORMAL``) survives a process crash; ``sync="full"``
  also survives power loss, at the price of an fsync per commit. A failed transaction (disk full, read-only
  file) is rolled back and leaves the in-memory counters and the clock as they were.
* **One thread.** The service creates, uses and closes a ``StateStore`` on its one store thread, so the
  connection is never shared and a slow commit never runs on the event loop.
* **The clock is part of the data.** The greatest HLC issued is written in the same transaction as the
  value carrying it, so after a restart (or ``kill -9``) the clock resumes above every version it ever
  handed out, even if the wall clock went backwards meanwhile.
* **Expiry is decided by the caller's ``now_ms``**, never by "has the sweep run yet": an entry whose
  ``expires_at <= now_ms`` is absent for every operation. A change that touches such an entry first
  removes it, so the DELETE of the expiry is reported before the change that follows it. ``expire``
  removes whatever is due and ``next_expiry`` tells the service when to call it next.
* **Fencing, conditions and quotas are checked in that order**, inside the transaction, against the live
  entry only.

Time comes in as arguments, so tests (and the hypothesis model test) drive expiry without sleeping.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from appliance.sqlite_files import DatabaseFileError, quick_check, refuse_emptied
from appliance.statestore import errors
from appliance.statestore.commands import Condition, SetCommand
from appliance.statestore.errors import StateStoreError
from appliance.statestore.hlc import Hlc, HybridClock

FILE_NAME = "statestore.db"
SYNC_LEVELS = {"normal": "NORMAL", "full": "FULL"}
EXPIRE_BATCH = 1000

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB PRIMARY KEY,
    value BLOB NOT NULL,
    version TEXT NOT NULL,
    fencing_token TEXT,
    expires_at INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_by_expiry ON entries (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS clock (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    wall_ms INTEGER NOT NULL,
    counter INTEGER NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Entry:
    value: bytes
    version: Hlc
    fencing_token: Hlc | None
    expires_at: int | None


@dataclass(frozen=True, slots=True)
class Change:
    """One committed change, for notifications: ``value`` None means the key was deleted (or expired)."""

    key: bytes
    value: bytes | None
    version: Hlc


@dataclass(slots=True)
class SetOutcome:
    applied: bool
    version: Hlc
    changes: list[Change] = field(default_factory=list)


@dataclass(slots=True)
class DeleteOutcome:
    """``count``: 1 deleted, 0 no such key, -1 VDEL value mismatch. ``version``: the entry's, if any."""

    count: int
    version: Hlc | None
    changes: list[Change] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Quotas:
    max_keys: int
    max_bytes: int  # keys plus values


class StateStore:
    def __init__(self, data_dir: Path, node_id: str, quotas: Quotas, sync: str = "normal") -> None:
        if sync not in SYNC_LEVELS:
            raise ValueError(f"sync must be one of {', '.join(SYNC_LEVELS)}")
        self.path = Path(data_dir) / FILE_NAME
        self.quotas = quotas
        self.path.parent.mkdir(parents=True, exist_ok=True)
        refuse_emptied(self.path, "state store database")
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            quick_check(self._db, self.path, "state store database")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={SYNC_LEVELS[sync]}")
            self._db.executescript(SCHEMA)
            self.clock = HybridClock(node_id)
            row = self._db.execute("SELECT wall_ms, counter FROM clock WHERE id = 0").fetchone()
            if row is not None:
                self.clock.advance_to(Hlc(row[0], row[1], node_id))
            count, size = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(key) + LENGTH(value)), 0) FROM entries").fetchone()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise DatabaseFileError(
                self.path, f"not a readable state store database ({exc}); move it away to start with an empty one"
            ) from exc
        except BaseException:
            self._db.close()
            raise
        self.key_count: int = count
        self.total_bytes: int = size

    def close(self) -> None:
        self._db.close()

    # -- reads ---------------------------------------------------------------------------------------

    def get(self, key: bytes, now_ms: int) -> Entry | None:
        entry = self._load(key)
        if entry is None or _expired(entry, now_ms):
            return None
        return entry

    def next_expiry(self) -> int | None:
        """The earliest ``expires_at`` still stored (possibly already due), or None."""
        earliest: int | None = self._db.execute("SELECT MIN(expires_at) FROM entries WHERE expires_at IS NOT NULL").fetchone()[0]
        return earliest

    # -- changes -------------------------------------------------------------------------------------

    def set(self, command: SetCommand, timestamp: Hlc, fencing_token: Hlc | None, now_ms: int) -> SetOutcome:
        """SET with the request's ``__ts`` (``timestamp``) and optional ``__ft``; raises for refusals."""
        with self._transaction():
            changes: list[Change] = []
            current = self._load_live(command.key, now_ms, changes)
            if current is not None:
                _check_fencing(current.fencing_token, fencing_token)
            version = self.clock.receive(timestamp, now_ms)
            if not _condition_holds(command, current):
                self._save_clock()
                return SetOutcome(False, version, changes)
            if current is None:
                added_keys, added_bytes = 1, len(command.key) + len(command.value)
            else:
                added_keys, added_bytes = 0, len(command.value) - len(current.value)
            if added_keys and self.key_count + 1 > self.quotas.max_keys:
                raise StateStoreError(errors.QUOTA_EXCEEDED)
            if added_bytes > 0 and self.total_bytes + added_bytes > self.quotas.max_bytes:
                raise StateStoreError(errors.QUOTA_EXCEEDED)
            token = fencing_token
            if current is not None and current.fencing_token is not None:
                token = max(current.fencing_token, fencing_token) if fencing_token else current.fencing_token
            expires_at = now_ms + command.expire_ms if command.expire_ms is not None else None
            self._db.execute(
                "INSERT OR REPLACE INTO entries (key, value, version, fencing_token, expires_at) VALUES (?, ?, ?, ?, ?)",
                (command.key, command.value, str(version), str(token) if token else None, expires_at),
            )
            self._save_clock()
            self.key_count += added_keys
            self.total_bytes += added_bytes
            changes.append(Change(command.key, command.value, version))
            return SetOutcome(True, version, changes)

    def delete(self, key: bytes, fencing_token: Hlc | None, now_ms: int, only_value: bytes | None = None) -> DeleteOutcome:
        """DEL, or VDEL when ``only_value`` is given (delete only if the value is exactly that)."""
        with self._transaction():
            changes: list[Change] = []
            current = self._load_live(key, now_ms, changes)
            if current is None:
                return DeleteOutcome(0, None, changes)
            _check_fencing(current.fencing_token, fencing_token)
            if only_value is not None and current.value != only_value:
                return DeleteOutcome(-1, current.version, changes)
            self._remove(key, current)
            changes.append(Change(key, None, current.version))
            return DeleteOutcome(1, current.version, changes)

    def expire(self, now_ms: int) -> list[Change]:
        """Remove up to ``EXPIRE_BATCH`` entries that are due, oldest deadline first."""
        with self._transaction():
            rows = self._db.execute(
                "SELECT key, value, version FROM entries WHERE expires_at <= ? ORDER BY expires_at LIMIT ?",
                (now_ms, EXPIRE_BATCH),
            ).fetchall()
            changes = []
            for key, value, version in rows:
                self._db.execute("DELETE FROM entries WHERE key = ?", (key,))
                self.key_count -= 1
                self.total_bytes -= len(key) + len(value)
                changes.append(Change(key, None, Hlc.parse(version)))
            return changes

    # -- internals -----------------------------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        return _Transaction(self)

    def _load(self, key: bytes) -> Entry | None:
        row = self._db.execute(
            "SELECT value, version, fencing_token, expires_at FROM entries WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        value, version, token, expires_at = row
        return Entry(value, Hlc.parse(version), Hlc.parse(token) if token else None, expires_at)

    def _load_live(self, key: bytes, now_ms: int, changes: list[Change]) -> Entry | None:
        """The entry if it has not expired; an expired one is removed now and reported as deleted."""
        entry = self._load(key)
        if entry is not None and _expired(entry, now_ms):
            self._remove(key, entry)
            changes.append(Change(key, None, entry.version))
            return None
        return entry

    def _remove(self, key: bytes, entry: Entry) -> None:
        self._db.execute("DELETE FROM entries WHERE key = ?", (key,))
        self.key_count -= 1
        self.total_bytes -= len(key) + len(entry.value)

    def _save_clock(self) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO clock (id, wall_ms, counter) VALUES (0, ?, ?)",
            (self.clock.last.wall_ms, self.clock.last.counter),
        )


class _Transaction:
    """BEGIN IMMEDIATE .. COMMIT; on any exception - the COMMIT's own included (disk full, I/O error) - ROLLBACK
    and put the in-memory counters and the clock back, so memory never describes a change the file lacks."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def __enter__(self) -> None:
        self.saved = (self.store.key_count, self.store.total_bytes, self.store.clock.last)
        self.store._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self.store._db.execute("COMMIT")
                return
            except sqlite3.Error:
                self._undo()
                raise
        self._undo()

    def _undo(self) -> None:
        if self.store._db.in_transaction:  # SQLite may have rolled back on its own (e.g. SQLITE_FULL)
            self.store._db.execute("ROLLBACK")
        self.store.key_count, self.store.total_bytes, self.store.clock.last = self.saved


def _expired(entry: Entry, now_ms: int) -> bool:
    return entry.expires_at is not None and entry.expires_at <= now_ms


def _check_fencing(protecting: Hlc | None, offered: Hlc | None) -> None:
    """The protocol's fencing rule: once a key has a token, every change must bring one at least as new."""
    if protecting is None:
        return
    if offered is None:
        raise StateStoreError(errors.FENCING_TOKEN_REQUIRED)
    if offered < protecting:
        raise StateStoreError(errors.FENCING_TOKEN_LOWER)


def _condition_holds(command: SetCommand, current: Entry | None) -> bool:
    if command.condition is Condition.NX:
        return current is None
    if command.condition is Condition.NEX:
        return current is None or current.value == command.value
    return True
