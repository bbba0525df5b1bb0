"""The broker's durable state in one SQLite database (``broker.db``, WAL mode) under the data directory.

What it holds: durable sessions (with their will message), their subscriptions, the QoS 1/2 messages
queued for or in flight to each session, the inbound QoS 2 packet ids awaiting PUBREL, retained messages,
and a ``meta`` table with the schema version.

Why it is built this way:

* "We commit before we ack": the broker sends PUBACK/PUBREC/SUBACK only after the change is committed.
  Committing per message would cap throughput at the disk's commit rate, so every mutating method here
  only *buffers* the change in memory, and the server calls ``commit()`` once per event-loop turn, after
  it has handled every packet read in that turn and before it writes the acknowledgements. One turn is
  one transaction, written with ``executemany``.
* Work that cancels out inside one turn never reaches the disk: a delivery enqueued and acknowledged
  (or removed) in the same turn is dropped from the buffer, and a message no delivery refers to any more
  is not written at all. Message payloads are stored once (``messages``) and referenced by every
  session queue entry (``outbound``); a trigger deletes a message when its last queue entry goes.
* ``synchronous``: ``normal`` survives a killed process (``kill -9``: the WAL is in the OS cache) and
  commits with a ``write(2)``; ``full`` also survives power loss at the cost of an fsync per commit.
* Ids are assigned in memory (message ids, queue sequence numbers) so callers get them at once, without
  a round trip; queue order per session is sequence order.
* ``commit()`` blocks (a write, plus an fsync in ``full`` mode). For ``full`` on slow storage the server
  may split it: ``take_batch()`` on the loop, ``write_batch(batch)`` in a single worker thread, batches
  strictly in order. A failed write raises ``PersistenceError`` and keeps the batch: ``commit()`` retries
  it first next time, so nothing buffered is lost (but nothing may be acknowledged until it succeeds).
* Times are wall-clock UNIX seconds (``time.time()``), because they must survive a restart.

Publish properties (MQTT 5) are stored as one blob, ``encode_properties``: UTF-8 JSON of an object whose
keys are property names chosen by the caller and whose values are int, str, bytes (written as
``{"b64": "..."}``) or lists (user properties: lists of ``[key, value]`` pairs, read back as tuples). It
is self-describing, readable with the ``sqlite3`` shell, and never unpickles anything.

Schema versions: ``SCHEMA_VERSION`` is written in ``meta``. Opening a database from a newer gateway
raises ``SchemaTooNewError`` (we never guess at a newer layout); an older one is migrated on opening, in
one transaction (``_migrate``). Version 2 has version 1's tables; what changed is the meaning of an away
session's will (see ``StoredSession``), so a version 1 gateway refuses a version 2 file.
A file that is not a broker database raises ``CorruptDatabaseError`` naming the file.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Union

from appliance.broker.topic_tree import SubscriptionOptions

SCHEMA_VERSION = 2
SYNCHRONOUS_LEVELS = ("normal", "full")
DB_FILENAME = "broker.db"

PropertyValue = Union[int, str, bytes, Sequence[tuple[str, str]], Sequence[int]]


class PersistenceError(Exception):
    """The broker database cannot be opened, read or written."""


class CorruptDatabaseError(PersistenceError):
    """The file exists but is not a readable broker database."""


class SchemaTooNewError(PersistenceError):
    """The database was written by a newer gateway with a schema this version does not know."""


class OutboundState(IntEnum):
    """Where an outbound QoS 1/2 delivery stands."""

    QUEUED = 0  # not sent yet (or sent and not recorded): send with a new packet id
    PUBLISH_SENT = 1  # PUBLISH sent with ``packet_id``; resend with DUP after reconnect
    PUBREL_SENT = 2  # QoS 2: PUBREC received, PUBREL sent; resend PUBREL after reconnect


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A QoS 1/2 message, stored once however many sessions it is queued for."""

    topic: str
    payload: bytes
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    expires_at: float | None = None  # from the message expiry interval; None: never


@dataclass(frozen=True, slots=True)
class StoredDelivery:
    """One entry of a session's outbound queue; ``qos``/``retain`` are as delivered to this session."""

    seq: int
    client_id: str
    message_id: int
    qos: int
    retain: bool = False
    subscription_ids: tuple[int, ...] = ()
    packet_id: int | None = None
    state: OutboundState = OutboundState.QUEUED


@dataclass(frozen=True, slots=True)
class StoredWill:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    delay_interval: int = 0


@dataclass(frozen=True, slots=True)
class StoredSession:
    """A durable session. ``disconnected_at`` is None while connected: after a crash such a session's
    client did not disconnect normally, so its will is due and its expiry counts from the restart.
    Once disconnected, ``will`` is set only while the will waits out its Will Delay Interval (it is
    cleared when published), so a restart can publish it at ``disconnected_at`` + the delay."""

    client_id: str
    protocol_level: int  # 4 = MQTT 3.1.1, 5 = MQTT 5
    expiry_interval: int  # seconds; 0xFFFFFFFF never expires
    username: str | None = None
    disconnected_at: float | None = None
    will: StoredWill | None = None


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    topic: str
    payload: bytes
    qos: int
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    expires_at: float | None = None


@dataclass(slots=True)
class LoadedSession:
    """A session with everything hanging off it, as ``load`` returns it."""

    session: StoredSession
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)  # by topic filter as sent
    outbound: list[StoredDelivery] = field(default_factory=list)  # in queue (sequence) order
    inbound_qos2: set[int] = field(default_factory=set)  # packet ids awaiting PUBREL


@dataclass(slots=True)
class BrokerState:
    """Everything needed to rebuild the broker after a restart."""

    sessions: dict[str, LoadedSession]
    messages: dict[int, StoredMessage]  # every message some outbound entry refers to
    retained: dict[str, RetainedMessage]


@dataclass(slots=True)
class Batch:
    """One turn's changes, in the order they must be applied (see ``take_batch``)."""

    messages: list[tuple[object, ...]]
    deliveries: list[tuple[object, ...]]
    operations: list[tuple[str, tuple[object, ...]]]


def encode_properties(properties: Mapping[str, PropertyValue]) -> bytes | None:
    """The blob for a property mapping (None when empty); TypeError for an unsupported value."""
    if not properties:
        return None
    encoded: dict[str, object] = {}
    for name, value in properties.items():
        if isinstance(value, bytes):
            encoded[name] = {"b64": base64.b64encode(value).decode("ascii")}
        elif isinstance(value, bool) or not isinstance(value, (int, str, list, tuple)):
            raise TypeError(f"property {name!r}: cannot store a {type(value).__name__}")
        elif isinstance(value, (list, tuple)):
            encoded[name] = [_encode_item(name, item) for item in value]
        else:
            encoded[name] = value
    return json.dumps(encoded, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _encode_item(name: str, item: object) -> object:
    if isinstance(item, int) and not isinstance(item, bool):
        return item
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(part, str) for part in item):
        return [item[0], item[1]]
    raise TypeError(f"property {name!r}: list items must be ints or (str, str) pairs, got {item!r}")


def decode_properties(blob: bytes | None) -> dict[str, PropertyValue]:
    """The inverse of ``encode_properties``."""
    if blob is None:
        return {}
    decoded: dict[str, PropertyValue] = {}
    for name, value in json.loads(blob).items():
        if isinstance(value, dict):
            decoded[name] = base64.b64decode(value["b64"])
        elif isinstance(value, list):
            decoded[name] = [tuple(item) if isinstance(item, list) else item for item in value]  # type: ignore[misc]
        else:
            decoded[name] = value
    return decoded


_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE sessions (
    client_id TEXT PRIMARY KEY,
    protocol_level INTEGER NOT NULL,
    expiry_interval INTEGER NOT NULL,
    username TEXT,
    disconnected_at REAL,
    will_topic TEXT,
    will_payload BLOB,
    will_qos INTEGER,
    will_retain INTEGER,
    will_properties BLOB,
    will_delay_interval INTEGER
) WITHOUT ROWID;
CREATE TABLE subscriptions (
    client_id TEXT NOT NULL,
    topic_filter TEXT NOT NULL,
    qos INTEGER NOT NULL,
    no_local INTEGER NOT NULL,
    retain_as_published INTEGER NOT NULL,
    retain_handling INTEGER NOT NULL,
    subscription_identifier INTEGER,
    PRIMARY KEY (client_id, topic_filter)
) WITHOUT ROWID;
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    properties BLOB,
    expires_at REAL
);
CREATE TABLE outbound (
    seq INTEGER PRIMARY KEY,
    client_id TEXT NOT NULL,
    message_id INTEGER NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    subscription_ids TEXT,
    packet_id INTEGER,
    state INTEGER NOT NULL
);
CREATE INDEX outbound_by_client ON outbound (client_id, seq);
CREATE INDEX outbound_by_message ON outbound (message_id);
CREATE TRIGGER outbound_release_message AFTER DELETE ON outbound
BEGIN
    DELETE FROM messages WHERE id = OLD.message_id
        AND NOT EXISTS (SELECT 1 FROM outbound WHERE message_id = OLD.message_id);
END;
CREATE TABLE inbound_qos2 (
    client_id TEXT NOT NULL,
    packet_id INTEGER NOT NULL,
    PRIMARY KEY (client_id, packet_id)
) WITHOUT ROWID;
CREATE TABLE retained (
    topic TEXT PRIMARY KEY,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    properties BLOB,
    expires_at REAL
) WITHOUT ROWID;
"""

_INSERT_MESSAGE = "INSERT INTO messages (id, topic, payload, properties, expires_at) VALUES (?, ?, ?, ?, ?)"
_INSERT_DELIVERY = (
    "INSERT INTO outbound (seq, client_id, message_id, qos, retain, subscription_ids, packet_id, state)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_MARK_DELIVERY = "UPDATE outbound SET packet_id = ?, state = ? WHERE seq = ?"
_DELETE_DELIVERY = "DELETE FROM outbound WHERE seq = ?"
_UPSERT_SESSION = (
    "INSERT OR REPLACE INTO sessions (client_id, protocol_level, expiry_interval, username, disconnected_at,"
    " will_topic, will_payload, will_qos, will_retain, will_properties, will_delay_interval)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SET_DISCONNECTED = "UPDATE sessions SET disconnected_at = ? WHERE client_id = ?"
_CLEAR_WILL = (
    "UPDATE sessions SET will_topic = NULL, will_payload = NULL, will_qos = NULL, will_retain = NULL,"
    " will_properties = NULL, will_delay_interval = NULL WHERE client_id = ?"
)
_UPSERT_SUBSCRIPTION = (
    "INSERT OR REPLACE INTO subscriptions (client_id, topic_filter, qos, no_local, retain_as_published,"
    " retain_handling, subscription_identifier) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_DELETE_SUBSCRIPTION = "DELETE FROM subscriptions WHERE client_id = ? AND topic_filter = ?"
_ADD_INBOUND = "INSERT OR IGNORE INTO inbound_qos2 (client_id, packet_id) VALUES (?, ?)"
_REMOVE_INBOUND = "DELETE FROM inbound_qos2 WHERE client_id = ? AND packet_id = ?"
_UPSERT_RETAINED = "INSERT OR REPLACE INTO retained (topic, payload, qos, properties, expires_at) VALUES (?, ?, ?, ?, ?)"
_DELETE_RETAINED = "DELETE FROM retained WHERE topic = ?"
_DELETE_SESSION = (
    "DELETE FROM sessions WHERE client_id = ?",
    "DELETE FROM subscriptions WHERE client_id = ?",
    "DELETE FROM inbound_qos2 WHERE client_id = ?",
)
# Only entries enqueued before delete_session: later ones in the same turn belong to the new session.
_DELETE_SESSION_QUEUE = "DELETE FROM outbound WHERE client_id = ? AND seq < ?"


class BrokerStore:
    """The open ``broker.db``. Mutators buffer; ``commit()`` writes one transaction. Not thread-safe
    except as ``take_batch``/``write_batch`` describe."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        """Use ``BrokerStore.open``."""
        self._db = connection
        self.path = path
        self._write_lock = threading.Lock()
        self._next_message_id = 1 + (connection.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0])
        self._next_seq = 1 + (connection.execute("SELECT coalesce(max(seq), 0) FROM outbound").fetchone()[0])
        self._reset_buffer()
        self._failed: list[Batch] = []

    def _reset_buffer(self) -> None:
        self._new_messages: dict[int, tuple[object, ...]] = {}
        self._new_message_refs: dict[int, int] = {}
        self._new_deliveries: dict[int, list[object]] = {}
        self._operations: list[tuple[str, tuple[object, ...]]] = []

    @classmethod
    def open(cls, path: Path, synchronous: str = "normal") -> BrokerStore:
        """Open or create the database at ``path`` (its folder is created).

        Raises ``CorruptDatabaseError`` for a file that is not a broker database, ``SchemaTooNewError``
        for one from a newer gateway, ``PersistenceError`` if it cannot be opened at all.
        """
        if synchronous not in SYNCHRONOUS_LEVELS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_LEVELS}, got {synchronous!r}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise PersistenceError(f"{path}: cannot open the broker database: {exc}") from exc
        try:
            _prepare(connection, path, synchronous)
            return cls(connection, path)
        except sqlite3.DatabaseError as exc:
            connection.close()
            raise CorruptDatabaseError(
                f"{path}: not a readable broker database ({exc}); move it away to start with an empty store"
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
        self._operations.append(
            (
                _UPSERT_SESSION,
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
                    encode_properties(will.properties) if will else None,
                    will.delay_interval if will else None,
                ),
            )
        )

    def set_disconnected(self, client_id: str, at: float | None) -> None:
        """Record when the client went away (None: connected again)."""
        self._operations.append((_SET_DISCONNECTED, (at, client_id)))

    def clear_will(self, client_id: str) -> None:
        """The will was published (or dropped by the ACL): after a restart it must not be published again.

        A stored will of a disconnected session means "still waiting out its delay", so the restart can
        schedule it; clearing it in the same turn that routed it keeps the two in one transaction.
        """
        self._operations.append((_CLEAR_WILL, (client_id,)))

    def delete_session(self, client_id: str) -> None:
        """Forget a session with its subscriptions, queue and inbound QoS 2 state (clean start, expiry).

        Changes buffered later in the same turn for the same client id (a new session) are kept.
        """
        for seq in [seq for seq, row in self._new_deliveries.items() if row[1] == client_id]:
            self._drop_new_delivery(seq)
        for statement in _DELETE_SESSION:
            self._operations.append((statement, (client_id,)))
        self._operations.append((_DELETE_SESSION_QUEUE, (client_id, self._next_seq)))

    def save_subscription(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> None:
        """Insert or replace one subscription (``topic_filter`` as the client sent it)."""
        self._operations.append(
            (
                _UPSERT_SUBSCRIPTION,
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
        self._operations.append((_DELETE_SUBSCRIPTION, (client_id, topic_filter)))

    # -- outbound queues ------------------------------------------------------------------------------

    def add_message(self, message: StoredMessage) -> int:
        """Store a message body once and return its id for ``enqueue``.

        A message that no ``enqueue`` in the same turn refers to is not written.
        """
        message_id = self._next_message_id
        self._next_message_id += 1
        self._new_messages[message_id] = (
            message_id,
            message.topic,
            message.payload,
            encode_properties(message.properties),
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
        """Append a delivery of a stored message to a session's queue; return its sequence number."""
        seq = self._next_seq
        self._next_seq += 1
        ids = ",".join(str(identifier) for identifier in subscription_ids) or None
        self._new_deliveries[seq] = [seq, client_id, message_id, qos, int(retain), ids, None, int(OutboundState.QUEUED)]
        if message_id in self._new_message_refs:
            self._new_message_refs[message_id] += 1
        return seq

    def mark_publish_sent(self, seq: int, packet_id: int) -> None:
        """The PUBLISH went out with ``packet_id``; after a reconnect it is resent with DUP."""
        self._mark(seq, packet_id, OutboundState.PUBLISH_SENT)

    def mark_pubrel_sent(self, seq: int, packet_id: int) -> None:
        """QoS 2: PUBREC arrived and PUBREL went out; after a reconnect PUBREL is resent."""
        self._mark(seq, packet_id, OutboundState.PUBREL_SENT)

    def _mark(self, seq: int, packet_id: int, state: OutboundState) -> None:
        row = self._new_deliveries.get(seq)
        if row is not None:
            row[6] = packet_id
            row[7] = int(state)
        else:
            self._operations.append((_MARK_DELIVERY, (packet_id, int(state), seq)))

    def remove_delivery(self, seq: int) -> None:
        """The delivery is complete (PUBACK, PUBCOMP) or dropped (expired); frees an unreferenced message."""
        if seq in self._new_deliveries:
            self._drop_new_delivery(seq)
        else:
            self._operations.append((_DELETE_DELIVERY, (seq,)))

    def _drop_new_delivery(self, seq: int) -> None:
        row = self._new_deliveries.pop(seq)
        message_id = row[2]
        if message_id in self._new_message_refs:
            self._new_message_refs[message_id] -= 1

    # -- inbound QoS 2 --------------------------------------------------------------------------------

    def add_inbound_qos2(self, client_id: str, packet_id: int) -> None:
        """A QoS 2 PUBLISH was accepted; duplicates with this packet id are ignored until PUBREL."""
        self._operations.append((_ADD_INBOUND, (client_id, packet_id)))

    def remove_inbound_qos2(self, client_id: str, packet_id: int) -> None:
        """PUBREL arrived: the packet id may be reused."""
        self._operations.append((_REMOVE_INBOUND, (client_id, packet_id)))

    # -- retained -------------------------------------------------------------------------------------

    def set_retained(self, message: RetainedMessage) -> None:
        self._operations.append(
            (
                _UPSERT_RETAINED,
                (message.topic, message.payload, message.qos, encode_properties(message.properties), message.expires_at),
            )
        )

    def delete_retained(self, topic: str) -> None:
        self._operations.append((_DELETE_RETAINED, (topic,)))

    # -- committing -----------------------------------------------------------------------------------

    @property
    def has_pending(self) -> bool:
        """Whether ``commit`` has anything to write (cheap; call it every turn)."""
        return bool(self._new_deliveries or self._operations or self._failed)

    def commit(self) -> None:
        """Write every buffered change in one transaction. Raises ``PersistenceError`` (changes kept)."""
        batch = self.take_batch()
        if batch is not None:
            self._failed.append(batch)
        while self._failed:
            self.write_batch(self._failed[0])
            self._failed.pop(0)

    def take_batch(self) -> Batch | None:
        """Detach the buffered changes (None if there are none); write them with ``write_batch``."""
        if not (self._new_deliveries or self._operations or self._new_messages):
            return None
        messages = [row for message_id, row in self._new_messages.items() if self._new_message_refs[message_id] > 0]
        batch = Batch(messages, [tuple(row) for row in self._new_deliveries.values()], self._operations)
        self._reset_buffer()
        if not (batch.messages or batch.deliveries or batch.operations):
            return None
        return batch

    def write_batch(self, batch: Batch) -> None:
        """Apply one batch in one transaction; safe to call from one worker thread, batches in order."""
        with self._write_lock:
            try:
                self._db.execute("BEGIN")
                if batch.messages:
                    self._db.executemany(_INSERT_MESSAGE, batch.messages)
                if batch.deliveries:
                    self._db.executemany(_INSERT_DELIVERY, batch.deliveries)
                start = 0
                operations = batch.operations
                while start < len(operations):
                    statement = operations[start][0]
                    end = start + 1
                    while end < len(operations) and operations[end][0] is statement:
                        end += 1
                    if end - start == 1:
                        self._db.execute(statement, operations[start][1])
                    else:
                        self._db.executemany(statement, [params for _, params in operations[start:end]])
                    start = end
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise PersistenceError(f"{self.path}: commit failed: {exc}") from exc

    # -- loading --------------------------------------------------------------------------------------

    def load(self) -> BrokerState:
        """Read everything committed. Rows of clients without a session row are left out."""
        try:
            return self._load()
        except sqlite3.DatabaseError as exc:
            raise CorruptDatabaseError(f"{self.path}: cannot read the broker database: {exc}") from exc

    def _load(self) -> BrokerState:
        db = self._db
        sessions: dict[str, LoadedSession] = {}
        for row in db.execute(
            "SELECT client_id, protocol_level, expiry_interval, username, disconnected_at, will_topic, will_payload,"
            " will_qos, will_retain, will_properties, will_delay_interval FROM sessions"
        ):
            will = None
            if row[5] is not None:
                will = StoredWill(row[5], row[6], row[7], bool(row[8]), decode_properties(row[9]), row[10])
            session = StoredSession(row[0], row[1], row[2], row[3], row[4], will)
            sessions[session.client_id] = LoadedSession(session)
        for row in db.execute(
            "SELECT client_id, topic_filter, qos, no_local, retain_as_published, retain_handling,"
            " subscription_identifier FROM subscriptions"
        ):
            loaded = sessions.get(row[0])
            if loaded is not None:
                loaded.subscriptions[row[1]] = SubscriptionOptions(row[2], bool(row[3]), bool(row[4]), row[5], row[6])
        message_ids: set[int] = set()
        for row in db.execute(
            "SELECT seq, client_id, message_id, qos, retain, subscription_ids, packet_id, state FROM outbound ORDER BY seq"
        ):
            loaded = sessions.get(row[1])
            if loaded is None:
                continue
            ids = tuple(int(part) for part in row[5].split(",")) if row[5] else ()
            loaded.outbound.append(StoredDelivery(row[0], row[1], row[2], row[3], bool(row[4]), ids, row[6], OutboundState(row[7])))
            message_ids.add(row[2])
        messages: dict[int, StoredMessage] = {}
        for row in db.execute("SELECT id, topic, payload, properties, expires_at FROM messages"):
            if row[0] in message_ids:
                messages[row[0]] = StoredMessage(row[1], row[2], decode_properties(row[3]), row[4])
        for row in db.execute("SELECT client_id, packet_id FROM inbound_qos2"):
            loaded = sessions.get(row[0])
            if loaded is not None:
                loaded.inbound_qos2.add(row[1])
        retained = {
            row[0]: RetainedMessage(row[0], row[1], row[2], decode_properties(row[3]), row[4])
            for row in db.execute("SELECT topic, payload, qos, properties, expires_at FROM retained")
        }
        return BrokerState(sessions, messages, retained)


def _prepare(connection: sqlite3.Connection, path: Path, synchronous: str) -> None:
    """Set the pragmas and create or check the schema; sqlite3 errors mean a bad file."""
    tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise PersistenceError(f"{path}: cannot switch the database to WAL mode (got {mode!r})")
    connection.execute(f"PRAGMA synchronous = {synchronous.upper()}")
    if not tables:
        connection.execute("BEGIN")
        _create_schema(connection)
        connection.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        connection.execute("COMMIT")
        return
    if "meta" not in tables:
        raise CorruptDatabaseError(f"{path}: an SQLite file, but not a broker database (no meta table); move it away")
    row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None or not str(row[0]).isdigit():
        raise CorruptDatabaseError(f"{path}: broker database without a valid schema version; move it away")
    version = int(row[0])
    if version > SCHEMA_VERSION:
        raise SchemaTooNewError(
            f"{path}: written by a newer gateway (schema version {version}; this one understands up to "
            f"{SCHEMA_VERSION}); upgrade the gateway or move the file away"
        )
    if version < SCHEMA_VERSION:
        _migrate(connection, version)


def _migrate(connection: sqlite3.Connection, version: int) -> None:
    """Bring a database written by an older gateway up to ``SCHEMA_VERSION``, in one transaction.

    1 -> 2: version 1 kept an away client's will after publishing it; version 2 keeps it only while it
    waits out its delay, and a restart publishes what it keeps. A version 1 row cannot tell the two
    apart, so its away wills are dropped: a will published twice is worse than a delayed one lost, and
    version 1 lost those anyway. Wills of sessions that were connected (``disconnected_at`` NULL) stay.
    """
    connection.execute("BEGIN")
    if version < 2:
        connection.execute(
            "UPDATE sessions SET will_topic = NULL, will_payload = NULL, will_qos = NULL, will_retain = NULL,"
            " will_properties = NULL, will_delay_interval = NULL WHERE disconnected_at IS NOT NULL"
        )
    connection.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
    connection.execute("COMMIT")


def _create_schema(connection: sqlite3.Connection) -> None:
    # executescript would COMMIT the open transaction; run the statements one by one inside it.
    for statement in _split_statements(_SCHEMA):
        connection.execute(statement)


def _split_statements(script: str) -> list[str]:
    statements: list[str] = []
    current = ""
    for line in script.strip().splitlines():
        current += line + "\n"
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return statements
