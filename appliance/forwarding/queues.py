"""The durable store: one message body, referenced by every endpoint queue ``<endpoint>_Pri<n>`` it was routed to.

Rules
-----

* Edge Hub's ``MessageStore`` writes the body and each queue entry separately, so a crash in between leaves
  a body no queue references, or an entry with no body. Here the body and all its entries go in ONE SQLite
  transaction (WAL, ``synchronous=FULL``) before ``add`` returns, so "the device got its PUBACK" means
  "every queue has it".
* Group commit: ``add_many`` stores several whole messages in one transaction - one fsync for all of them
  instead of one each, which is what bounds ingest on an SD card. Each message sits in its own SAVEPOINT,
  so one that fails (store full, a constraint) is undone alone and the others still commit.
* The priority and TTL are snapshotted into each entry when it is stored; a later manifest does not
  change pending messages (Azure/iotedge's Route_priority_and_TTL.md, "live deployment manifest changes").
* The offset of an entry is the message's sequence number, which is monotonic, so every queue is ordered
  by it and a checkpoint is just "everything up to offset N is done".
* TTL is checked on read (expired entries are skipped, never returned) and again by ``cleanup``, which
  deletes expired entries for every queue - whether or not its endpoint is up (Azure/iotedge issue 7509) - and
  frees bodies that no queue references any more.
* How often an endpoint refused an entry, and how often the link dropped while it was in flight
  (dead-letter candidates), is kept next to the checkpoints and forgotten with the entry, so a restart
  does not give a refused or poisonous message three more tries.
* The store is bounded (``max_bytes`` of bodies and headers): to make room it drops whole messages, lowest
  priority first and oldest first within a priority, and never a message of higher priority than the one
  arriving; if that is not enough the new message is refused (``StoreFull``) and nothing is dropped.

Used from one thread at a time (the service runs it on a dedicated worker thread).
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from appliance.asyncio_runtime import wall_clock
from appliance.forwarding.messages import Message
from appliance.forwarding.routes import RouteResult

QueueKey = tuple[str, int]  # (endpoint id, priority)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    enqueued_ms INTEGER NOT NULL,
    size INTEGER NOT NULL,
    best_priority INTEGER NOT NULL,
    envelope TEXT NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_priority ON messages (best_priority, seq);
CREATE TABLE IF NOT EXISTS entries (
    queue TEXT NOT NULL,
    seq INTEGER NOT NULL,
    endpoint TEXT NOT NULL,
    priority INTEGER NOT NULL,
    enqueued_ms INTEGER NOT NULL,
    ttl_s INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY (queue, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_by_seq ON entries (seq);
CREATE TABLE IF NOT EXISTS checkpoints (queue TEXT PRIMARY KEY, offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS refusals (queue TEXT NOT NULL, seq INTEGER NOT NULL, count INTEGER NOT NULL,
                                     PRIMARY KEY (queue, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS link_drops (queue TEXT NOT NULL, seq INTEGER NOT NULL, count INTEGER NOT NULL,
                                      PRIMARY KEY (queue, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    seq INTEGER NOT NULL,
    endpoint TEXT NOT NULL,
    priority INTEGER NOT NULL,
    enqueued_ms INTEGER NOT NULL,
    dead_ms INTEGER NOT NULL,
    reason TEXT NOT NULL,
    envelope TEXT NOT NULL,
    payload BLOB NOT NULL
);
"""

#: Bookkeeping bytes counted per message on top of body and envelope (rows, index entries).
ROW_OVERHEAD = 64
#: A new store numbers its messages from its creation time in UNIX seconds times this (2**20), so that a
#: store created after another one was lost (a factory reset, a replaced SD card) never repeats its
#: sequence numbers: the message id ``{gateway_id}:{seq}`` is the cloud's duplicate key, and a repeated
#: one would be dropped there as a duplicate of a message sent months before. Numbers stay unique as long
#: as the clock at the new store's creation is later than the old one's and the old store averaged under
#: a million messages a second; they stay under 2**53 (exact in JSON numbers) until the year 2242.
SEQUENCE_PER_SECOND = 1 << 20
#: Dead letters kept for the operator; beyond this the oldest go (they are outside ``max_bytes``).
MAX_DEAD_LETTERS = 1000


def queue_name(endpoint: str, priority: int) -> str:
    """Edge Hub's ``MessageQueueIdHelper``: one queue per endpoint per priority."""
    return f"{endpoint}_Pri{priority}"


class UnreadableEntry(Exception):
    """The stored envelope of entry ``seq`` does not decode (a store written by hand, a bug): the pump
    moves it to the dead letters instead of failing on it forever."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"entry {seq}: {reason}")
        self.seq = seq
        self.reason = reason


class StoreFull(Exception):
    """The store is at ``max_bytes`` and only messages of higher priority than the new one are left."""


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    seq: int
    endpoint: str
    priority: int
    enqueued_ms: int
    ttl_s: int
    expires_ms: int
    message: Message

    @property
    def size(self) -> int:
        return len(self.message.payload)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    seq: int
    endpoint: str
    priority: int
    enqueued_ms: int
    dead_ms: int
    reason: str
    message: Message


@dataclass(frozen=True, slots=True)
class QueueDepth:
    endpoint: str
    priority: int
    depth: int
    oldest_enqueued_ms: int | None
    #: The TTL the oldest entry was stored with: its age over this is how near the queue is to expiring.
    oldest_ttl_s: int | None = None


def _envelope(message: Message) -> str:
    return json.dumps(
        {
            "source": message.source,
            "topic": message.topic,
            "device": message.device_id,
            "module": message.module_id,
            "output": message.output,
            "props": message.properties,
            "ctype": message.content_type,
            "cenc": message.content_encoding,
            "mid": message.message_id,
            **({"sys": message.system} if message.system else {}),
        },
        separators=(",", ":"),
    )


def _message(envelope: str, payload: bytes) -> Message:
    e = json.loads(envelope)
    return Message(
        e["source"], e["topic"], payload, e["device"], e["module"], e["output"],
        [tuple(p) for p in e["props"]], e["ctype"], e["cenc"], e["mid"], e.get("sys", {}),
    )


def _readable_message(envelope: str, payload: bytes) -> Message:
    """The message, or for an envelope that does not decode (an ``UnreadableEntry`` dead letter) a stand-in
    that keeps the payload and shows the raw envelope as its topic."""
    try:
        return _message(envelope, payload)
    except (ValueError, KeyError, TypeError, IndexError):
        return Message("?", envelope[:200], payload, "?")


class MessageStore:
    def __init__(
        self,
        path: Path,
        max_bytes: int | None = None,
        check_entire_queue_on_cleanup: bool = False,
        clock: Callable[[], float] = wall_clock,
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.check_entire_queue_on_cleanup = check_entire_queue_on_cleanup
        self.clock = clock
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        self._seed_sequence()
        self.stored_bytes = int(self.db.execute("SELECT COALESCE(SUM(size), 0) FROM messages").fetchone()[0])

    def _seed_sequence(self) -> None:
        """Start a store that has never numbered a message at ``SEQUENCE_PER_SECOND`` times now."""
        with self._transaction():
            if self.db.execute("SELECT 1 FROM sqlite_sequence WHERE name = 'messages'").fetchone() is None:
                first = max(int(self.clock()), 0) * SEQUENCE_PER_SECOND
                self.db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('messages', ?)", (first,))

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception (the COMMIT's own included)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:  # SQLite already rolled back after some errors (SQLITE_FULL):
                self.db.execute("ROLLBACK")  # a second ROLLBACK would raise and hide the real error
            raise

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- writing

    def add(self, message: Message, results: Sequence[RouteResult]) -> tuple[int, Counter[QueueKey]]:
        """Store the body once and one entry per result, atomically; returns (seq, dropped per queue).

        Raises ``StoreFull`` (having changed nothing) when room can only be made by dropping messages of
        higher priority than this one.
        """
        [outcome] = self.add_many([(message, results)])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def add_many(
        self, items: Sequence[tuple[Message, Sequence[RouteResult]]]
    ) -> list[tuple[int, Counter[QueueKey]] | Exception]:
        """``add`` for each item, all in ONE transaction (one commit, one fsync); per item the outcome
        of ``add`` or the exception it would have raised (that item changed nothing). If the commit itself
        fails, nothing is stored and the error is raised."""
        outcomes: list[tuple[int, Counter[QueueKey]] | Exception] = []
        change = 0
        with self._transaction():
            for message, results in items:
                self.db.execute("SAVEPOINT message")
                try:
                    seq, dropped, size_change = self._insert(message, results, self.stored_bytes + change)
                except (StoreFull, sqlite3.Error) as exc:
                    if not self.db.in_transaction:  # SQLite rolled back all of it (SQLITE_FULL): nothing is
                        raise  # stored, and ROLLBACK TO would fail with "no such savepoint", hiding why
                    self.db.execute("ROLLBACK TO message")
                    self.db.execute("RELEASE message")
                    outcomes.append(exc)
                    continue
                self.db.execute("RELEASE message")
                change += size_change
                outcomes.append((seq, dropped))
        self.stored_bytes += change
        return outcomes

    def _insert(self, message: Message, results: Sequence[RouteResult], stored_bytes: int) -> tuple[int, Counter[QueueKey], int]:
        """Inside a transaction: make room, write body and entries; returns (seq, dropped, size change)."""
        now = self.now_ms()
        envelope = _envelope(message)
        size = len(message.payload) + len(envelope) + ROW_OVERHEAD
        best = min(r.priority for r in results)
        dropped: Counter[QueueKey] = Counter()
        freed = 0
        if self.max_bytes is not None:
            while stored_bytes - freed + size > self.max_bytes:
                victim = self.db.execute(
                    "SELECT seq, size FROM messages WHERE best_priority >= ? ORDER BY best_priority DESC, seq LIMIT 1",
                    (best,),
                ).fetchone()
                if victim is None:
                    raise StoreFull(f"store full ({self.max_bytes} bytes) of messages with priority above {best}")
                for endpoint, priority in self.db.execute("SELECT endpoint, priority FROM entries WHERE seq = ?", (victim[0],)):
                    dropped[(endpoint, priority)] += 1
                self.db.execute("DELETE FROM entries WHERE seq = ?", (victim[0],))
                self.db.execute("DELETE FROM messages WHERE seq = ?", (victim[0],))
                freed += victim[1]
        seq = self.db.execute(
            "INSERT INTO messages (enqueued_ms, size, best_priority, envelope, payload) VALUES (?, ?, ?, ?, ?)",
            (now, size, best, envelope, message.payload),
        ).lastrowid
        assert seq is not None
        self.db.executemany(
            "INSERT INTO entries (queue, seq, endpoint, priority, enqueued_ms, ttl_s, expires_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (queue_name(r.endpoint.id, r.priority), seq, r.endpoint.id, r.priority, now, r.ttl_s, now + r.ttl_s * 1000)
                for r in results
            ],
        )
        return seq, dropped, size - freed

    # -- reading

    def read(self, endpoint: str, priority: int, after_seq: int, limit: int, max_bytes: int | None = None) -> list[QueuedMessage]:
        """Up to ``limit`` unexpired entries after ``after_seq``, in order; at least two if there are (one
        if ``limit`` is 1), then stopping before ``max_bytes`` of payload. Two: a packing sender measures
        the link from the spacing of two PUBACKs, and with messages larger than its first byte window a
        batch of one would never measure it, and the window never grow, at all."""
        now = self.now_ms()
        rows = self.db.execute(
            "SELECT e.seq, e.enqueued_ms, e.ttl_s, e.expires_ms, m.envelope, m.payload FROM entries e "
            "JOIN messages m ON m.seq = e.seq WHERE e.queue = ? AND e.seq > ? AND e.expires_ms > ? ORDER BY e.seq LIMIT ?",
            (queue_name(endpoint, priority), after_seq, now, limit),
        ).fetchall()
        batch: list[QueuedMessage] = []
        total = 0
        for seq, enqueued, ttl, expires, envelope, payload in rows:
            if len(batch) >= 2 and max_bytes is not None and total + len(payload) > max_bytes:
                break
            total += len(payload)
            try:
                message = _message(envelope, payload)
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                if batch:
                    break  # the good ones first; it comes first in the next read
                raise UnreadableEntry(seq, f"stored envelope unreadable: {type(exc).__name__}: {exc}") from exc
            batch.append(QueuedMessage(seq, endpoint, priority, enqueued, ttl, expires, message))
        return batch

    def endpoints(self) -> list[str]:
        """Endpoints with pending entries - also those a newer manifest no longer routes to."""
        return [r[0] for r in self.db.execute("SELECT DISTINCT endpoint FROM entries ORDER BY endpoint")]

    def checkpoint_of(self, endpoint: str, priority: int) -> int:
        row = self.db.execute("SELECT offset FROM checkpoints WHERE queue = ?", (queue_name(endpoint, priority),)).fetchone()
        return row[0] if row else 0

    # -- completing

    def checkpoint(self, endpoint: str, priority: int, offset: int, sent: Iterable[int]) -> tuple[int, int]:
        """Everything in the queue up to ``offset`` is done: ``sent`` were delivered, the rest had expired.
        ``sent`` may also name entries after ``offset`` (delivered after one that was not): those go too.

        Deletes those entries, frees bodies nobody references and records the checkpoint, in one
        transaction. Returns (sent, expired) counts.
        """
        queue = queue_name(endpoint, priority)
        sent_set = set(sent)
        beyond = sorted(seq for seq in sent_set if seq > offset)
        with self._transaction():
            seqs = [r[0] for r in self.db.execute("SELECT seq FROM entries WHERE queue = ? AND seq <= ?", (queue, offset))]
            self.db.execute("DELETE FROM entries WHERE queue = ? AND seq <= ?", (queue, offset))
            self.db.execute("DELETE FROM refusals WHERE queue = ? AND seq <= ?", (queue, offset))
            self.db.execute("DELETE FROM link_drops WHERE queue = ? AND seq <= ?", (queue, offset))
            for seq in beyond:
                if self.db.execute("DELETE FROM entries WHERE queue = ? AND seq = ?", (queue, seq)).rowcount:
                    seqs.append(seq)
                self.db.execute("DELETE FROM refusals WHERE queue = ? AND seq = ?", (queue, seq))
                self.db.execute("DELETE FROM link_drops WHERE queue = ? AND seq = ?", (queue, seq))
            self.db.execute(
                "INSERT INTO checkpoints (queue, offset) VALUES (?, ?)"
                " ON CONFLICT(queue) DO UPDATE SET offset = MAX(offset, excluded.offset)",
                (queue, offset),
            )
            freed = self._free_orphans(seqs)
        self.stored_bytes -= freed
        done = sum(1 for s in seqs if s in sent_set)
        return done, len(seqs) - done

    def dead_letter(self, endpoint: str, priority: int, seqs: Iterable[int], reason: str) -> int:
        """Move the entries ``seqs`` of one queue to the dead letters (a copy of the message each, with
        ``reason``), free bodies nobody references, keep the newest ``MAX_DEAD_LETTERS``; one
        transaction. Returns how many entries moved."""
        queue = queue_name(endpoint, priority)
        wanted = sorted(set(seqs))
        now = self.now_ms()
        with self._transaction():
            moved = 0
            for seq in wanted:
                row = self.db.execute(
                    "SELECT e.enqueued_ms, m.envelope, m.payload FROM entries e JOIN messages m ON m.seq = e.seq "
                    "WHERE e.queue = ? AND e.seq = ?", (queue, seq),
                ).fetchone()
                if row is None:
                    continue  # expired and cleaned up meanwhile
                self.db.execute(
                    "INSERT INTO dead_letters (seq, endpoint, priority, enqueued_ms, dead_ms, reason, envelope, payload) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (seq, endpoint, priority, row[0], now, reason, row[1], row[2]),
                )
                self.db.execute("DELETE FROM entries WHERE queue = ? AND seq = ?", (queue, seq))
                self.db.execute("DELETE FROM refusals WHERE queue = ? AND seq = ?", (queue, seq))
                self.db.execute("DELETE FROM link_drops WHERE queue = ? AND seq = ?", (queue, seq))
                moved += 1
            self.db.execute(
                "DELETE FROM dead_letters WHERE id <= (SELECT MAX(id) FROM dead_letters) - ?", (MAX_DEAD_LETTERS,)
            )
            freed = self._free_orphans(wanted)
        self.stored_bytes -= freed
        return moved

    def count_refusals(self, endpoint: str, priority: int, seqs: Iterable[int]) -> dict[int, int]:
        """The endpoint refused the entries ``seqs`` once more; returns each one's refusals so far."""
        return self._count_once_more("refusals", endpoint, priority, seqs)

    def count_link_drops(self, endpoint: str, priority: int, seqs: Iterable[int]) -> dict[int, int]:
        """The link dropped once more while the entries ``seqs`` were in flight; returns each one's drops
        so far."""
        return self._count_once_more("link_drops", endpoint, priority, seqs)

    def _count_once_more(self, table: str, endpoint: str, priority: int, seqs: Iterable[int]) -> dict[int, int]:
        """One more for each of ``seqs`` in a per-entry count table (``refusals``, ``link_drops``), in one
        transaction; each entry's count after it."""
        queue = queue_name(endpoint, priority)
        wanted = sorted(set(seqs))
        with self._transaction():
            for seq in wanted:
                self.db.execute(
                    f"INSERT INTO {table} (queue, seq, count) VALUES (?, ?, 1) "
                    "ON CONFLICT(queue, seq) DO UPDATE SET count = count + 1", (queue, seq),
                )
            return {seq: self._entry_count(table, queue, seq) for seq in wanted}

    def last_link_drop_suspect(self, endpoint: str, priority: int) -> int:
        """The highest sequence number of the queue that was in flight at a link drop (0: none)."""
        row = self.db.execute("SELECT MAX(seq) FROM link_drops WHERE queue = ?", (queue_name(endpoint, priority),)).fetchone()
        return int(row[0] or 0)

    def link_drops(self, endpoint: str, priority: int, seq: int) -> int:
        return self._entry_count("link_drops", queue_name(endpoint, priority), seq)

    def refusals(self, endpoint: str, priority: int, seq: int) -> int:
        return self._entry_count("refusals", queue_name(endpoint, priority), seq)

    def _entry_count(self, table: str, queue: str, seq: int) -> int:
        row = self.db.execute(f"SELECT count FROM {table} WHERE queue = ? AND seq = ?", (queue, seq)).fetchone()
        return 0 if row is None else int(row[0])

    def clear_dead_letters(self) -> int:
        """Remove every dead letter (once an operator has handled them); returns how many there were."""
        with self._transaction():
            return self.db.execute("DELETE FROM dead_letters").rowcount

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest ``limit`` dead letters, oldest first."""
        rows = self.db.execute(
            "SELECT seq, endpoint, priority, enqueued_ms, dead_ms, reason, envelope, payload FROM dead_letters "
            "ORDER BY id DESC LIMIT ?", (limit,),
        ).fetchall()
        return [DeadLetter(seq, endpoint, priority, enqueued_ms, dead_ms, reason, _readable_message(envelope, payload))
                for seq, endpoint, priority, enqueued_ms, dead_ms, reason, envelope, payload in reversed(rows)]

    def cleanup(self) -> Counter[QueueKey]:
        """Delete expired entries and the bodies they kept alive; returns expired counts per queue.

        With ``check_entire_queue_on_cleanup`` every expired entry goes; without it only the expired
        prefix of each queue (cheaper, and enough when one queue has one TTL), as in Edge Hub.
        """
        now = self.now_ms()
        expired: Counter[QueueKey] = Counter()
        with self._transaction():
            if self.check_entire_queue_on_cleanup:
                doomed = self.db.execute(
                    "SELECT queue, seq, endpoint, priority FROM entries WHERE expires_ms <= ?", (now,)
                ).fetchall()
            else:
                doomed = []
                for (queue,) in self.db.execute("SELECT DISTINCT queue FROM entries").fetchall():
                    head_alive = self.db.execute(
                        "SELECT MIN(seq) FROM entries WHERE queue = ? AND expires_ms > ?", (queue, now)
                    ).fetchone()[0]
                    doomed += self.db.execute(
                        "SELECT queue, seq, endpoint, priority FROM entries WHERE queue = ? AND seq < ?",
                        (queue, head_alive if head_alive is not None else 1 << 62),
                    ).fetchall()
            self.db.executemany("DELETE FROM entries WHERE queue = ? AND seq = ?", [(q, s) for q, s, _, _ in doomed])
            self.db.executemany("DELETE FROM refusals WHERE queue = ? AND seq = ?", [(q, s) for q, s, _, _ in doomed])
            self.db.executemany("DELETE FROM link_drops WHERE queue = ? AND seq = ?", [(q, s) for q, s, _, _ in doomed])
            for _, _, endpoint, priority in doomed:
                expired[(endpoint, priority)] += 1
            freed = self._free_orphans([s for _, s, _, _ in doomed])
        self.stored_bytes -= freed
        return expired

    def _free_orphans(self, seqs: Iterable[int]) -> int:
        freed = 0
        for seq in set(seqs):
            row = self.db.execute(
                "SELECT size FROM messages WHERE seq = ? AND NOT EXISTS (SELECT 1 FROM entries WHERE entries.seq = ?)", (seq, seq)
            ).fetchone()
            if row is not None:
                self.db.execute("DELETE FROM messages WHERE seq = ?", (seq,))
                freed += row[0]
        return freed

    # -- observing

    def depths(self) -> list[QueueDepth]:
        rows = self.db.execute(
            # With one MIN() SQLite takes the bare ttl_s from the row holding the minimum: the oldest entry's.
            "SELECT endpoint, priority, COUNT(*), MIN(enqueued_ms), ttl_s FROM entries GROUP BY endpoint, priority "
            "ORDER BY endpoint, priority"
        )
        return [QueueDepth(*row) for row in rows]

    def entry_count(self) -> int:
        """Queue entries waiting, over every endpoint and priority: what the backlog LED shows."""
        return int(self.db.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def message_count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
