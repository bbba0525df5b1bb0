"""The broker's durable state in one SQLite database (``broker.db``, WAL mode) under the data directory.

What it holds: durable sessions (with their will message), their subscriptions, the QoS 1/2 messages
queued for or in flight to each session, the inbound QoS 2 packet ids awaiting PUBREL, retained messages,
and a ``meta`` table with the schema version. Beside this module: the layout and its migrations
(``schema``), the records handed in and out (``records``), the restart's load and the queue pages
(``reads``), the statements a turn is written with (``writes``), and how the broker's live objects map
onto them (``storage``).

Rules
-----
* We commit before we ack: the broker sends PUBACK/PUBREC/SUBACK only after the change is committed.
* One event-loop turn is one transaction: every mutating method only *buffers* its change, and the broker
  calls ``commit()`` once per turn, after it has handled every packet read in that turn and before it
  writes the acknowledgements (committing per message would cap throughput at the disk's commit rate).
* Work that cancels out inside one turn never reaches the disk: a delivery enqueued and acknowledged (or
  removed) in the same turn is dropped from the buffer, and a message no delivery refers to any more is
  not written at all.
* A failed write raises ``PersistenceError`` and keeps the batch: ``commit()`` retries it first next time,
  so nothing buffered is lost (and nothing may be acknowledged until it succeeds).
* Queues are read, not loaded: an away session's backlog never has to fit in memory.

Theory of operation
-------------------
``commit()`` runs on the event loop and blocks it for the write (and, with ``synchronous = "full"``, the
fsync): a store thread was measured slower (bench/RESULTS.md, "Where the broker commits"), and on the loop
commit-before-ack is trivially true on every path. A turn is written with ``executemany`` (and one
DELETE for its finished deliveries). A message queued for one session only (the common case: one
durable subscriber) is stored in its queue entry (``outbound``), one row; one queued for several (or
large: ``storage.INLINE_PAYLOAD_BYTES``) is stored once (``messages``) and referenced by each of their
entries, and a trigger deletes it when its last entry goes. Ids (message ids, queue sequence numbers)
are assigned in memory, so callers get them at once without a round trip; queue order per session is
sequence order.
``load`` returns only the deliveries in flight and counts the queued ones; ``page`` reads a session's next
queued rows (the ``(client_id, seq)`` index), followed by those still in the buffer.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from appliance.broker.persistence import writes as sql
from appliance.broker.persistence.reads import (
    committed_page,
    load_state,
    subscription_ids,
)
from appliance.broker.persistence.records import (
    BrokerState,
    LoadedSession,
    OutboundState,
    PropertyValue,
    RetainedMessage,
    StoredDelivery,
    StoredMessage,
    StoredSession,
    StoredWill,
    properties_from_blob,
    properties_to_blob,
)
from appliance.broker.persistence.schema import (
    SCHEMA_VERSION,
    SYNCHRONOUS_LEVELS,
    CorruptDatabaseError,
    PersistenceError,
    SchemaTooNewError,
    prepare,
)
from appliance.broker.routing.delivery import stored_packet_id
from appliance.broker.routing.topic_tree import SubscriptionOptions
from appliance.sqlite_files import DatabaseFileError, refuse_emptied

__all__ = [
    "DB_FILENAME", "SCHEMA_VERSION", "SYNCHRONOUS_LEVELS", "BrokerState", "BrokerStore", "CorruptDatabaseError",
    "LoadedSession", "OutboundState", "PersistenceError", "PropertyValue", "RetainedMessage", "SchemaTooNewError",
    "StoredDelivery", "StoredMessage", "StoredSession", "StoredWill", "properties_from_blob", "properties_to_blob",
]

DB_FILENAME = "broker.db"
#: ``OutboundState`` values as stored, looked up once (``enqueue`` runs per durable delivery).
_QUEUED = int(OutboundState.QUEUED)
_PUBLISH_SENT = int(OutboundState.PUBLISH_SENT)
_PUBREL_SENT = int(OutboundState.PUBREL_SENT)
#: A buffered delivery is a list in ``sql.INSERT_DELIVERY``'s column order (this many columns) when its
#: body is in the row and it has nothing else; in ``sql.INSERT_DELIVERY_FULL``'s otherwise.
_SHORT_ROW = 8
_PACKET_ID, _STATE, _MESSAGE_ID = 4, 5, 8


@dataclass(slots=True)
class _Batch:
    """One turn's changes, in the order they must be applied: shared message bodies, then new deliveries
    (short rows, full rows: ``_SHORT_ROW``), then ``operations``, (statement, parameter rows) one
    ``executemany`` each."""

    messages: list[tuple[object, ...]]
    deliveries: list[list[object]]
    full_deliveries: list[list[object]]
    operations: list[tuple[str, list[tuple[object, ...]]]]


class BrokerStore:
    """The open ``broker.db``. Mutators buffer; ``commit()`` writes one transaction. Not thread-safe
    from one thread at a time (the event loop's)."""

    #: The open stretch of progress operations (``_end_progress``): marks and deletes of deliveries.
    _marks: list[tuple[object, ...]]
    _deletes: list[int]

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        """Use ``BrokerStore.open``."""
        self._db = connection
        self.path = path
        self._next_message_id: int = 1 + (connection.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0])
        self._next_seq: int = 1 + (connection.execute("SELECT coalesce(max(seq), 0) FROM outbound").fetchone()[0])
        self._reset_buffer()
        self._failed: list[_Batch] = []
        #: Grows with every buffered change that needs a write (not with cancelled-out work): the broker
        #: compares it around a packet to tell whether the packet's acknowledgement waits on the commit.
        self.revision = 0

    def _buffer(self, operation: tuple[str, tuple[object, ...]]) -> None:
        """Every buffered statement but the deliveries' progress goes through here, so ``revision``
        counts it. The same statement as the one before joins its rows (one ``executemany``)."""
        if self._marks or self._deletes:
            self._end_progress()
        statement, params = operation
        operations = self._operations
        if operations and operations[-1][0] is statement:
            operations[-1][1].append(params)
        else:
            operations.append((statement, [params]))
        self.revision += 1

    def _end_progress(self) -> None:
        """Close the stretch of progress (``_mark``, ``remove_delivery``) buffered since the last other
        statement: its UPDATEs, then its DELETEs. A durable QoS 1 message makes one of each, alternating
        (an acknowledgement, then the next PUBLISH), so they are kept apart and written as two statements
        per turn instead of two per message. The effect is the same as in their order: each touches one
        row by ``seq``, the UPDATEs of one row keep their order, and a DELETE ends its row (a finished
        delivery gets no more updates, ``Session._finished``; one after it would change nothing). Other
        statements keep their place before and after the stretch."""
        if self._marks:
            self._operations.append((sql.MARK_DELIVERY, self._marks))
            self._marks = []
        if self._deletes:
            # One statement for the stretch: its sequence numbers as a JSON array (``sql.DELETE_DELIVERIES``).
            self._operations.append((sql.DELETE_DELIVERIES, [("[" + ",".join(map(str, self._deletes)) + "]",)]))
            self._deletes = []

    def _reset_buffer(self) -> None:
        self._new_messages: dict[int, tuple[object, ...]] = {}
        self._new_message_refs: dict[int, int] = {}
        self._new_deliveries: dict[int, list[object]] = {}
        #: How many of ``_new_deliveries`` are full rows (``_SHORT_ROW``): usually none.
        self._new_full_rows = 0
        self._operations: list[tuple[str, list[tuple[object, ...]]]] = []
        self._marks = []
        self._deletes = []
        #: ``mark_sent_through`` by client id, written last in the batch (``_take_batch``).
        self._sent_through: dict[str, int] = {}

    @classmethod
    def open(cls, path: Path, synchronous: str = "normal") -> BrokerStore:
        """Open or create the database at ``path`` (its folder is created).

        Raises ``CorruptDatabaseError`` for a file that is not a broker database, ``SchemaTooNewError``
        for one from a newer gateway, ``PersistenceError`` if it cannot be opened at all.
        """
        if synchronous not in SYNCHRONOUS_LEVELS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_LEVELS}, got {synchronous!r}")
        try:
            refuse_emptied(path, "broker database")
        except DatabaseFileError as exc:
            raise CorruptDatabaseError(exc.path, exc.why) from None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise PersistenceError(path, f"cannot open the broker database: {exc}") from exc
        try:
            prepare(connection, path, synchronous)
            _settle_sent_through(connection, path)
            return cls(connection, path)
        except sqlite3.DatabaseError as exc:
            connection.close()
            raise CorruptDatabaseError(
                path, f"not a readable broker database ({exc}); move it away to start with an empty store"
            ) from exc
        except BaseException:
            connection.close()
            raise

    def close(self) -> None:
        """Close the database; uncommitted changes are discarded (commit first)."""
        self._db.close()

    # -- sessions -------------------------------------------------------------------------------------

    def save_session(self, session: StoredSession) -> None:
        """Insert or replace a session row (its subscriptions and queue are kept)."""
        will = session.will
        self._buffer(
            (
                sql.UPSERT_SESSION,
                (
                    session.client_id,
                    session.protocol_level,
                    session.expiry_interval,
                    session.username,
                    session.disconnected_at,
                    will.topic if will else None,
                    will.payload if will else None,
                    will.qos if will else None,
                    int(will.retain) if will else None,
                    properties_to_blob(will.properties) if will else None,
                    will.delay_interval if will else None,
                ),
            )
        )

    def set_disconnected(self, client_id: str, at: float | None) -> None:
        """Record when the client went away (None: connected again)."""
        self._buffer((sql.SET_DISCONNECTED, (at, client_id)))

    def clear_will(self, client_id: str) -> None:
        """The will was published (or dropped by the ACL): after a restart it must not be published again.

        A stored will of a disconnected session means "still waiting out its delay", so the restart can
        schedule it; clearing it in the same turn that routed it keeps the two in one transaction.
        """
        self._buffer((sql.CLEAR_WILL, (client_id,)))

    def delete_session(self, client_id: str) -> None:
        """Forget a session with its subscriptions, queue and inbound QoS 2 state (clean start, expiry).

        Changes buffered later in the same turn for the same client id (a new session) are kept.
        """
        for seq in [seq for seq, row in self._new_deliveries.items() if row[1] == client_id]:
            self._drop_new_delivery(seq)
        self._sent_through.pop(client_id, None)
        for statement in sql.DELETE_SESSION:
            self._buffer((statement, (client_id,)))
        self._buffer((sql.DELETE_SESSION_QUEUE, (client_id, self._next_seq)))

    def save_subscription(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> None:
        """Insert or replace one subscription (``topic_filter`` as the client sent it)."""
        self._buffer(
            (
                sql.UPSERT_SUBSCRIPTION,
                (
                    client_id,
                    topic_filter,
                    options.qos,
                    int(options.no_local),
                    int(options.retain_as_published),
                    options.retain_handling,
                    options.subscription_identifier,
                ),
            )
        )

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        self._buffer((sql.DELETE_SUBSCRIPTION, (client_id, topic_filter)))

    # -- outbound queues ------------------------------------------------------------------------------

    def add_message(self, message: StoredMessage) -> int:
        """Store a message body once and return its id for ``enqueue``: for a message queued for several
        sessions (one queued for one goes in its row: ``enqueue_message``).

        A message that no ``enqueue`` in the same turn refers to is not written.
        """
        message_id = self._next_message_id
        self._next_message_id += 1
        self._new_messages[message_id] = (
            message_id,
            message.topic,
            message.payload,
            properties_to_blob(message.properties),
            message.expires_at,
        )
        self._new_message_refs[message_id] = 0
        return message_id

    def enqueue(
        self,
        client_id: str,
        message_id: int,
        qos: int,
        retain: bool = False,
        subscription_ids: Iterable[int] = (),
    ) -> int:
        """Append a delivery of a message stored with ``add_message`` to a session's queue; return its
        sequence number."""
        seq = self._next_seq
        self._next_seq += 1
        self.revision += 1
        ids = ",".join(map(str, subscription_ids)) if subscription_ids else None
        self._new_deliveries[seq] = [seq, client_id, qos, int(retain), 0, _QUEUED, None, None, message_id, ids, None, None]
        self._new_full_rows += 1
        if message_id in self._new_message_refs:
            self._new_message_refs[message_id] += 1
        return seq

    def enqueue_message(
        self,
        client_id: str,
        qos: int,
        retain: bool,
        subscription_ids: Iterable[int] | None,
        topic: str,
        payload: bytes,
        properties: Mapping[str, PropertyValue],
        expires_at: float | None,
        packet_id: int = 0,
    ) -> int:
        """Append a delivery of a message queued for this session only, its body in the row; return its
        sequence number. ``packet_id``: the PUBLISH already went out with it (``mark_publish_sent``)."""
        seq = self._next_seq
        self._next_seq = seq + 1
        self.revision += 1
        state = _PUBLISH_SENT if packet_id else _QUEUED
        # A bytearray: ``sqlite3`` binds it directly, a bytes object through its adapter lookup (0.4 us
        # more per row on CPython 3.11, the copy included; bench/RESULTS.md). It reads back as bytes.
        body = bytearray(payload)
        if subscription_ids or properties or expires_at is not None:
            ids = ",".join(map(str, subscription_ids)) if subscription_ids else None
            self._new_deliveries[seq] = [seq, client_id, qos, int(retain), packet_id, state, topic, body, None,
                                         ids, properties_to_blob(properties), expires_at]
            self._new_full_rows += 1
        else:
            self._new_deliveries[seq] = [seq, client_id, qos, int(retain), packet_id, state, topic, body]
        return seq

    def mark_publish_sent(self, seq: int, packet_id: int) -> None:
        """The PUBLISH went out with ``packet_id``; after a reconnect it is resent with DUP."""
        self._mark(seq, packet_id, _PUBLISH_SENT)

    def mark_sent_through(self, client_id: str, seq: int) -> None:
        """The PUBLISH of ``seq`` went out with ``stored_packet_id(seq)``, and every stored delivery of
        this session before it that is still owed went out before it (``DeliveryJournal``). One
        ``outbound_sent`` row per session and turn records them all; the rows are rewritten only on the
        next opening (``sql.SETTLE_SENT_THROUGH``)."""
        row = self._new_deliveries.get(seq)
        if row is not None:
            row[_PACKET_ID] = stored_packet_id(seq)
            row[_STATE] = _PUBLISH_SENT
        else:
            self._sent_through[client_id] = seq
            self.revision += 1

    def mark_pubrel_sent(self, seq: int, packet_id: int) -> None:
        """QoS 2: PUBREC arrived and PUBREL went out; after a reconnect PUBREL is resent."""
        self._mark(seq, packet_id, _PUBREL_SENT)

    def _mark(self, seq: int, packet_id: int, state: int) -> None:
        row = self._new_deliveries.get(seq)
        if row is not None:
            row[_PACKET_ID] = packet_id
            row[_STATE] = state
        else:
            self._marks.append((packet_id, state, seq))  # counted as ``_buffer`` would: per message
            self.revision += 1

    def remove_delivery(self, seq: int) -> None:
        """The delivery is complete (PUBACK, PUBCOMP) or dropped (expired); frees an unreferenced message."""
        if seq in self._new_deliveries:
            self._drop_new_delivery(seq)
        else:
            self._deletes.append(seq)  # counted as ``_buffer`` would: per message
            self.revision += 1

    @property
    def last_seq(self) -> int:
        """The highest queue sequence number handed out so far."""
        return int(self._next_seq) - 1

    def page(self, client_id: str, after_seq: int, limit: int,
             max_bytes: int = 0) -> list[tuple[StoredDelivery, StoredMessage]]:
        """The next ``limit`` deliveries of a session's queue never sent (state QUEUED) after
        ``after_seq``, oldest first, with their messages: committed rows first, then the ones still
        buffered (this turn's, or a batch whose commit failed), which all have higher numbers. With
        ``max_bytes``, no row is read once that much payload is (the rows are fetched one by one)."""
        try:
            page, full = committed_page(self._db, client_id, after_seq, limit, max_bytes)
        except sqlite3.Error as exc:
            raise PersistenceError(self.path, f"cannot read queued messages: {exc}") from exc
        if not full and len(page) < limit and (self._failed or self._new_deliveries):
            after = page[-1][0].seq if page else after_seq
            page += self._buffered_page(client_id, after, limit - len(page))
        return page

    def _buffered_page(self, client_id: str, after_seq: int, limit: int) -> list[tuple[StoredDelivery, StoredMessage]]:
        batches = [*self._failed, _Batch(list(self._new_messages.values()), list(self._new_deliveries.values()), [], [])]
        messages = {row[0]: row for batch in batches for row in batch.messages}
        page: list[tuple[StoredDelivery, StoredMessage]] = []
        for batch in batches:
            for row in sorted([*batch.deliveries, *batch.full_deliveries], key=_seq):
                seq, owner = row[0], row[1]
                if owner != client_id or seq <= after_seq or row[_STATE] != _QUEUED:  # type: ignore[operator]
                    continue
                full = len(row) > _SHORT_ROW
                message_id = row[_MESSAGE_ID] if full else None
                if message_id is None:
                    body: tuple[object, ...] = (None, row[6], bytes(row[7]), row[10] if full else None,  # type: ignore[call-overload]
                                                row[11] if full else None)
                else:
                    body = messages.get(message_id) or (message_id, *self._db.execute(
                        "SELECT topic, payload, properties, expires_at FROM messages WHERE id = ?", (message_id,)
                    ).fetchone())
                ids = subscription_ids(row[9]) if full else ()
                page.append((StoredDelivery(seq, client_id, message_id, row[2], bool(row[3]), ids),  # type: ignore[arg-type]
                             StoredMessage(body[1], body[2], properties_from_blob(body[3]), body[4])))  # type: ignore[arg-type]
                if len(page) == limit:
                    return page
        return page

    def _drop_new_delivery(self, seq: int) -> None:
        row = self._new_deliveries.pop(seq)
        if len(row) > _SHORT_ROW:
            self._new_full_rows -= 1
            message_id = row[_MESSAGE_ID]
            if message_id in self._new_message_refs:
                self._new_message_refs[message_id] -= 1

    # -- inbound QoS 2 --------------------------------------------------------------------------------

    def add_inbound_qos2(self, client_id: str, packet_id: int) -> None:
        """A QoS 2 PUBLISH was accepted; duplicates with this packet id are ignored until PUBREL."""
        self._buffer((sql.ADD_INBOUND, (client_id, packet_id)))

    def remove_inbound_qos2(self, client_id: str, packet_id: int) -> None:
        """PUBREL arrived: the packet id may be reused."""
        self._buffer((sql.REMOVE_INBOUND, (client_id, packet_id)))

    # -- retained -------------------------------------------------------------------------------------

    def set_retained(self, message: RetainedMessage) -> None:
        self._buffer(
            (
                sql.UPSERT_RETAINED,
                (message.topic, message.payload, message.qos, properties_to_blob(message.properties), message.expires_at),
            )
        )

    def delete_retained(self, topic: str) -> None:
        self._buffer((sql.DELETE_RETAINED, (topic,)))

    # -- committing -----------------------------------------------------------------------------------

    @property
    def has_pending(self) -> bool:
        """Whether ``commit`` has anything to write (cheap; call it every turn)."""
        return bool(self._new_deliveries or self._operations or self._marks or self._deletes or self._sent_through
                    or self._failed)

    def commit(self) -> None:
        """Write every buffered change in one transaction. Raises ``PersistenceError`` (changes kept)."""
        batch = self._take_batch()
        if batch is not None:
            self._failed.append(batch)
        while self._failed:
            self._write_batch(self._failed[0])
            self._failed.pop(0)

    def _take_batch(self) -> _Batch | None:
        """Detach the buffered changes (None if there are none)."""
        self._end_progress()
        if self._sent_through:
            self._operations.append((sql.MARK_SENT_THROUGH, list(self._sent_through.items())))
        if not (self._new_deliveries or self._operations or self._new_messages):
            return None
        messages = [row for message_id, row in self._new_messages.items() if self._new_message_refs[message_id] > 0]
        rows = self._new_deliveries.values()
        if self._new_full_rows:
            batch = _Batch(messages, [row for row in rows if len(row) == _SHORT_ROW],
                           [row for row in rows if len(row) > _SHORT_ROW], self._operations)
        else:
            batch = _Batch(messages, list(rows), [], self._operations)
        self._reset_buffer()
        if not (batch.messages or batch.deliveries or batch.full_deliveries or batch.operations):
            return None
        return batch

    def _write_batch(self, batch: _Batch) -> None:
        """Apply one batch in one transaction."""
        try:
            self._db.execute("BEGIN")
            if batch.messages:
                self._db.executemany(sql.INSERT_MESSAGE, batch.messages)
            if batch.deliveries:
                self._db.executemany(sql.INSERT_DELIVERY, batch.deliveries)
            if batch.full_deliveries:
                self._db.executemany(sql.INSERT_DELIVERY_FULL, batch.full_deliveries)
            for statement, rows in batch.operations:
                if len(rows) == 1:
                    self._db.execute(statement, rows[0])
                else:
                    self._db.executemany(statement, rows)
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            full = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
            raise PersistenceError(self.path, f"commit failed: {exc}", disk_full=full) from exc

    # -- loading --------------------------------------------------------------------------------------

    def load(self) -> BrokerState:
        """Read everything committed. Rows of clients without a session row are left out."""
        try:
            return load_state(self._db)
        except sqlite3.DatabaseError as exc:
            raise CorruptDatabaseError(self.path, f"cannot read the broker database: {exc}") from exc


def _settle_sent_through(connection: sqlite3.Connection, path: Path) -> None:
    """Write what ``outbound_sent`` says into the ``outbound`` rows themselves and empty it, in one
    transaction: a restart then loads and pages one kind of row (``reads``)."""
    if connection.execute("SELECT 1 FROM outbound_sent LIMIT 1").fetchone() is None:
        return
    try:
        connection.execute("BEGIN")
        connection.execute(sql.SETTLE_SENT_THROUGH)
        connection.execute(sql.FORGET_SENT_THROUGH)
        connection.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise PersistenceError(path, f"cannot record the deliveries sent before the restart: {exc}",
                               disk_full=getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL) from exc


def _seq(row: list[object]) -> int:
    return row[0]  # type: ignore[return-value]
