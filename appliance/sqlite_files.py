"""Checks every SQLite file of the gateway gets before it is used: a file that SQLite would open but that
has lost its data must stop the start with a message naming the file, never be served or silently begun
again empty.

Two cases SQLite itself lets through:

* a zero-length file with no write-ahead log beside it (a copy cut short, a filesystem that lost the
  file's blocks): SQLite takes it for a new, empty database, and the gateway would start with no
  sessions, keys or queues - acknowledged data gone without a word. (A zero-length file *with* a
  non-empty ``-wal`` is a database that was never checkpointed; SQLite recovers it.)
* flipped pages: SQLite reads them until a query touches them, so a damaged store can answer for hours
  with wrong values; ``PRAGMA quick_check`` at start finds them in time proportional to the file.
  ``appliance doctor`` runs the slower ``PRAGMA integrity_check`` (it also checks that every index
  matches its table) through ``integrity_problems``, read-only.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from appliance.startup_error import StartupError


class DatabaseFileError(StartupError):
    """A database file that must not be used as it is; ``why`` says what to do."""


def refuse_emptied(path: Path, what: str) -> None:
    """Raise ``DatabaseFileError`` if ``path`` exists with zero bytes and no write-ahead log holds its data."""
    if not path.exists() or path.stat().st_size > 0:
        return
    wal = path.with_name(path.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return
    raise DatabaseFileError(
        path,
        f"the {what} is an empty file (0 bytes) - it lost its data (a copy cut short? a full or "
        "damaged disk?); restore it from a backup, or move it away to start with an empty one",
    )


def quick_check(connection: sqlite3.Connection, path: Path, what: str) -> None:
    """Raise ``DatabaseFileError`` unless SQLite's ``quick_check`` finds the file intact."""
    try:
        problems = [row[0] for row in connection.execute("PRAGMA quick_check(5)")]
    except sqlite3.DatabaseError as exc:
        raise DatabaseFileError(path, f"the {what} is damaged ({exc}); move it away to start with an empty one") from exc
    if problems != ["ok"]:
        raise DatabaseFileError(path, f"the {what} is damaged ({'; '.join(problems)}); move it away to start with an empty one")


def integrity_problems(path: Path, limit: int = 5) -> list[str]:
    """The first ``limit`` problems SQLite's ``integrity_check`` finds in ``path`` (empty: intact).

    The file is opened read-only (``mode=ro``), so a check never changes it, and may run beside the
    gateway that has it open (WAL readers do not block the writer)."""
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return [f"cannot be opened ({exc})"]
    try:
        problems = [str(row[0]) for row in connection.execute(f"PRAGMA integrity_check({int(limit)})")]
    except sqlite3.DatabaseError as exc:
        return [str(exc)]
    finally:
        connection.close()
    return [] if problems == ["ok"] else problems
