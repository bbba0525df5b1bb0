"""Factory reset on real SQLite files, including one held open by a live WAL writer."""

from __future__ import annotations

import sqlite3
import tarfile
from pathlib import Path

import pytest

from appliance.hardware.factory_reset import clear_database, factory_reset, write_backup


def make_db(path: Path, rows: int) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB)")
    connection.execute("CREATE TABLE log (id INTEGER PRIMARY KEY AUTOINCREMENT, line TEXT)")
    connection.executemany("INSERT INTO kv VALUES (?, ?)", [(f"k{i}", b"v" * 10) for i in range(rows)])
    connection.executemany("INSERT INTO log (line) VALUES (?)", [(f"l{i}",) for i in range(rows)])
    return connection


def count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as connection:
        return connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_reset_backs_up_every_database_then_empties_them_keeping_the_schema(tmp_path: Path) -> None:
    live = make_db(tmp_path / "statestore.db", 50)  # stays open, like the running store's connection
    make_db(tmp_path / "forwarding.db", 7).close()
    (tmp_path / "unrelated.db").write_bytes(b"not ours")

    report = factory_reset(tmp_path)

    assert report.cleared == ("statestore.db", "forwarding.db")
    assert report.rows_deleted == 2 * 50 + 2 * 7 + 2  # + the sqlite_sequence rows
    for name in report.cleared:
        assert count(tmp_path / name, "kv") == 0 and count(tmp_path / name, "log") == 0
    # The open connection keeps working against the emptied schema.
    live.execute("INSERT INTO kv VALUES ('after', x'00')")
    assert count(tmp_path / "statestore.db", "kv") == 1
    live.close()
    assert (tmp_path / "unrelated.db").read_bytes() == b"not ours"

    extract = tmp_path / "restored"
    with tarfile.open(report.backup) as archive:
        assert sorted(archive.getnames()) == ["MANIFEST", "forwarding.db", "statestore.db"]
        archive.extractall(extract, filter="data")
    assert count(extract / "statestore.db", "kv") == 50
    assert count(extract / "forwarding.db", "log") == 7
    assert report.backup.parent == tmp_path / "backups"
    assert not list(report.backup.parent.glob("*.new"))


def test_backup_sees_rows_still_only_in_the_wal(tmp_path: Path) -> None:
    writer = make_db(tmp_path / "broker.db", 0)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO kv VALUES ('in-wal', x'01')")
    backup = write_backup(tmp_path, now=0)
    writer.close()
    assert backup.name == "factory-reset-19700101T000000Z.tar.gz"
    with tarfile.open(backup) as archive:
        archive.extractall(tmp_path / "out", filter="data")
    assert count(tmp_path / "out" / "broker.db", "kv") == 1


def test_a_failing_backup_clears_nothing(tmp_path: Path) -> None:
    make_db(tmp_path / "forwarding.db", 3).close()
    (tmp_path / "backups").write_text("a file where the backup folder should be")
    with pytest.raises(OSError):
        factory_reset(tmp_path)
    assert count(tmp_path / "forwarding.db", "kv") == 3


def test_clear_rolls_back_when_a_table_cannot_be_emptied(tmp_path: Path) -> None:
    connection = make_db(tmp_path / "statestore.db", 4)
    connection.execute("CREATE TRIGGER keep BEFORE DELETE ON log BEGIN SELECT RAISE(ABORT, 'kept'); END")
    connection.close()
    with pytest.raises(sqlite3.IntegrityError, match="kept"):
        clear_database(tmp_path / "statestore.db")
    assert count(tmp_path / "statestore.db", "kv") == 4  # kv was emptied first, and rolled back
