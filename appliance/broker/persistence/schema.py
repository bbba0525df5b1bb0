"""The layout of ``broker.db``: its tables, its pragmas, and the migrations from older versions.

COMPATIBILITY NOTES (mosquitto's ``persist.h`` keeps the same kind): ``SCHEMA_VERSION`` is written in
``meta``. Opening a database from a newer gateway raises ``SchemaTooNewError`` (we never guess at a newer
layout); an older one is migrated on opening, in one transaction (``migrate``). Version 2 has version
1's tables; what changed is the meaning of an away session's will (see ``StoredSession``), so a version
1 gateway refuses a version 2 file. Version 3 stores a message queued for one session in its
``outbound`` row (``message_id`` NULL) and only a message queued for several in ``messages``; a
version 2 gateway would not read those rows, so it refuses a version 3 file. Version 4 adds
``outbound_sent``: a session's PUBLISHes sent in queue order with the packet id their sequence number
gives (``routing.delivery.stored_packet_id``) are recorded as one row per session, not by rewriting
each ``outbound`` row; a version 3 gateway would resend those as new, so it refuses a version 4 file.
A file that is not a broker database raises ``CorruptDatabaseError`` naming the file; a migration
that fails (a full disk) raises ``PersistenceError`` and leaves the file as it was.

``synchronous``: ``normal`` survives a killed process (``kill -9``: the WAL is in the OS cache) and
commits with a ``write(2)``; ``full`` also survives power loss at the cost of an fsync per commit.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from appliance.startup_error import StartupError

SCHEMA_VERSION = 4
SYNCHRONOUS_LEVELS = ("normal", "full")


class PersistenceError(StartupError):
    """The broker database cannot be opened, read or written. ``disk_full``: SQLite said "database or
    disk is full" (SQLITE_FULL), which the broker answers with Quota exceeded (docs/broker-security.md)."""

    def __init__(self, path: str | os.PathLike[str], why: str, disk_full: bool = False) -> None:
        super().__init__(path, why)
        self.disk_full = disk_full


class CorruptDatabaseError(PersistenceError):
    """The file exists but is not a readable broker database."""


class SchemaTooNewError(PersistenceError):
    """The database was written by a newer gateway with a schema this version does not know."""


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
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    packet_id INTEGER NOT NULL,
    state INTEGER NOT NULL,
    topic TEXT,
    payload BLOB,
    message_id INTEGER,
    subscription_ids TEXT,
    properties BLOB,
    expires_at REAL
);
CREATE INDEX outbound_by_client ON outbound (client_id, seq);
CREATE INDEX outbound_by_message ON outbound (message_id) WHERE message_id IS NOT NULL;
CREATE TRIGGER outbound_release_message AFTER DELETE ON outbound WHEN OLD.message_id IS NOT NULL
BEGIN
    DELETE FROM messages WHERE id = OLD.message_id
        AND NOT EXISTS (SELECT 1 FROM outbound WHERE message_id = OLD.message_id);
END;
CREATE TABLE outbound_sent (
    client_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL
) WITHOUT ROWID;
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


def prepare(connection: sqlite3.Connection, path: Path, synchronous: str) -> None:
    """Set the pragmas and create or check the schema; sqlite3 errors mean a bad file."""
    tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise PersistenceError(path, f"cannot switch the database to WAL mode (got {mode!r})")
    connection.execute(f"PRAGMA synchronous = {synchronous.upper()}")
    if not tables:
        connection.execute("BEGIN")
        _create_schema(connection)
        connection.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        connection.execute("COMMIT")
        return
    if "meta" not in tables:
        raise CorruptDatabaseError(path, "an SQLite file, but not a broker database (no meta table); move it away")
    row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None or not str(row[0]).isdigit():
        raise CorruptDatabaseError(path, "broker database without a valid schema version; move it away")
    version = int(row[0])
    if version > SCHEMA_VERSION:
        raise SchemaTooNewError(
            path, f"written by a newer gateway (schema version {version}; this one understands up to "
            f"{SCHEMA_VERSION}); upgrade the gateway or move the file away"
        )
    if version < SCHEMA_VERSION:
        try:
            migrate(connection, version)
        except sqlite3.Error as exc:
            # Not a corrupt file: a readable one that could not be rewritten (a full disk, most likely).
            # Its transaction is undone, so the file is still the older version, whole.
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise PersistenceError(
                path, f"cannot migrate the broker database from schema version {version} to {SCHEMA_VERSION} "
                f"({exc}); the file is unchanged: make room (or fix the cause) and start again",
                disk_full=getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL,
            ) from exc


def migrate(connection: sqlite3.Connection, version: int) -> None:
    """Bring a database written by an older gateway up to ``SCHEMA_VERSION``, in one transaction.

    1 -> 2: version 1 kept an away client's will after publishing it; version 2 keeps it only while it
    waits out its delay, and a restart publishes what it keeps. A version 1 row cannot tell the two
    apart, so its away wills are dropped: a will published twice is worse than a delayed one lost, and
    version 1 lost those anyway. Wills of sessions that were connected (``disconnected_at`` NULL) stay.

    2 -> 3: ``outbound`` rows may hold their message's body themselves (``message_id`` NULL), so a message
    queued for one session costs one row instead of two, and the trigger and the message id index only
    see the rows that share a body in ``messages``; ``packet_id`` is 0, not NULL, before the PUBLISH is
    sent. SQLite cannot drop a NOT NULL constraint in place, so the table is rebuilt (SQLite's documented
    procedure: new table, copy, drop, rename, then its index and trigger). Every version 2 row keeps its
    body in ``messages``, so nothing else moves.
    """
    connection.execute("BEGIN")
    if version < 2:
        connection.execute(
            "UPDATE sessions SET will_topic = NULL, will_payload = NULL, will_qos = NULL, will_retain = NULL,"
            " will_properties = NULL, will_delay_interval = NULL WHERE disconnected_at IS NOT NULL"
        )
    if version < 3:
        _rebuild_outbound(connection)
    if version < 4:
        connection.execute(_table("outbound_sent"))
    connection.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
    connection.execute("COMMIT")


def _rebuild_outbound(connection: sqlite3.Connection) -> None:
    """Version 2's ``outbound`` into version 3's layout (``migrate``), inside the open transaction."""
    statements = [s for s in _split_statements(_SCHEMA) if "outbound " in s.partition("\n")[0]]
    table, *index_and_trigger = statements
    connection.execute(table.replace("CREATE TABLE outbound ", "CREATE TABLE outbound_v3 ", 1))
    connection.execute(
        "INSERT INTO outbound_v3 (seq, client_id, qos, retain, packet_id, state, message_id, subscription_ids)"
        " SELECT seq, client_id, qos, retain, coalesce(packet_id, 0), state, message_id, subscription_ids"
        " FROM outbound"
    )
    connection.execute("DROP TABLE outbound")  # with its indexes and trigger
    connection.execute("ALTER TABLE outbound_v3 RENAME TO outbound")
    for statement in index_and_trigger:
        connection.execute(statement)


def _table(name: str) -> str:
    """The CREATE TABLE statement of ``name`` in the current layout."""
    return next(s for s in _split_statements(_SCHEMA) if s.startswith(f"CREATE TABLE {name} ("))


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
