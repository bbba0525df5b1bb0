"""The layout of ``broker.db``: its tables, its pragmas, and the migrations from older versions.

COMPATIBILITY NOTES (mosquitto's ``persist.h`` keeps the same kind): ``SCHEMA_VERSION`` is written in
``meta``. Opening a database from a newer gateway raises ``SchemaTooNewError`` (we never guess at a newer
layout); an older one is migrated on opening, in one transaction (``migrate``). Version 2 has version
1's tables; what changed is the meaning of an away session's will (see ``StoredSession``), so a version
1 gateway refuses a version 2 file. A file that is not a broker database raises
``CorruptDatabaseError`` naming the file.

``synchronous``: ``normal`` survives a killed process (``kill -9``: the WAL is in the OS cache) and
commits with a ``write(2)``; ``full`` also survives power loss at the cost of an fsync per commit.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from appliance.startup_error import StartupError

SCHEMA_VERSION = 2
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
        migrate(connection, version)


def migrate(connection: sqlite3.Connection, version: int) -> None:
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
