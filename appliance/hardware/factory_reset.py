"""Factory reset: back up the gateway's databases, then empty them.

A long press of the button only *requests* the reset; the gateway stops (listeners, services, stores),
calls ``reset_after_shutdown`` and exits with ``FACTORY_RESET_EXIT_STATUS`` so systemd starts it again.
Doing the work with every store closed means no cached session, queue checkpoint or retained message can
be written back into a database that was just emptied.

* The backup uses SQLite's online backup API, never a file copy, so it is consistent even if some other
  process has a database open. Each database is backed up into a temporary file, the files are packed
  into one ``.tar.gz``, written through ``atomic_file.replacing`` (temporary file, fsync, rename: ``persist__backup``
  style), so a power cut leaves either a whole archive or none.
* Clearing deletes every row in one transaction per database instead of deleting the files: the schema
  (and its version) stays, a crash mid-reset leaves each database either untouched or empty, and the
  next start opens the same files as always.

Only the databases in ``DATABASE_FILES`` are touched; backups live in ``<data dir>/backups`` and survive.
If the backup fails, nothing is cleared.
"""

from __future__ import annotations

import io
import logging
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from appliance import atomic_file
from appliance.asyncio_runtime import wall_clock

if TYPE_CHECKING:
    import tarfile

log = logging.getLogger(__name__)

DATABASE_FILES = ("statestore.db", "forwarding.db", "broker.db")
BACKUP_DIR_NAME = "backups"
#: The gateway exits with this after a reset; systemd/appliance.service restarts on it (RestartForceExitStatus=).
FACTORY_RESET_EXIT_STATUS = 75


@dataclass(frozen=True, slots=True)
class ResetReport:
    backup: Path
    cleared: tuple[str, ...]
    rows_deleted: int


def existing_databases(data_dir: Path) -> list[Path]:
    return [data_dir / name for name in DATABASE_FILES if (data_dir / name).is_file()]


def write_backup(data_dir: Path, now: float | None = None) -> Path:
    """Pack a consistent copy of every gateway database into ``backups/factory-reset-<UTC time>.tar.gz``."""
    import tarfile  # here, not with the module, which every gateway start imports: only a reset packs a backup

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(wall_clock() if now is None else now))
    backup_dir = data_dir / BACKUP_DIR_NAME
    backup_dir.mkdir(mode=0o700, exist_ok=True)
    target = backup_dir / f"factory-reset-{stamp}.tar.gz"
    with (
        tempfile.TemporaryDirectory(dir=backup_dir) as scratch,
        atomic_file.replacing(target, mode=0o600) as raw,
        tarfile.open(fileobj=raw, mode="w:gz") as archive,
    ):
        for database in existing_databases(data_dir):
            snapshot = Path(scratch) / database.name
            _online_backup(database, snapshot)
            archive.add(snapshot, arcname=database.name)
        archive.addfile(_manifest_info(stamp), io.BytesIO(_manifest(stamp)))
    return target


def _online_backup(source: Path, destination: Path) -> None:
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(destination)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def _manifest(stamp: str) -> bytes:
    return f"appliance factory-reset backup taken {stamp}\n".encode()


def _manifest_info(stamp: str) -> tarfile.TarInfo:
    import tarfile

    info = tarfile.TarInfo("MANIFEST")
    info.size = len(_manifest(stamp))
    info.mtime = int(wall_clock())
    return info


def clear_database(database: Path) -> int:
    """Delete every row of every table in one transaction; returns the number of rows deleted."""
    connection = sqlite3.connect(database, timeout=10.0, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        try:
            tables = [
                row[0]
                for row in connection.execute("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_stat%'")
            ]
            deleted = 0
            for table in tables:
                quoted = '"' + table.replace('"', '""') + '"'
                deleted += connection.execute(f"DELETE FROM {quoted}").rowcount
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        # Move the deletions out of the WAL into the main file so the old rows do not linger in it.
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return deleted
    finally:
        connection.close()


def reset_after_shutdown(data_dir: Path) -> ResetReport | None:
    """The gateway's last step after a requested reset: never raises, says what happened in the log."""
    try:
        report = factory_reset(data_dir)
    except (OSError, sqlite3.Error) as exc:
        log.error("factory reset failed, nothing was cleared: %s", exc)
        return None
    log.warning("factory reset done: backup %s, cleared %s", report.backup, ", ".join(report.cleared) or "nothing")
    return report


def factory_reset(data_dir: Path) -> ResetReport:
    """Back up, then clear. If the backup fails nothing is cleared: the exception propagates first."""
    backup = write_backup(data_dir)
    databases = existing_databases(data_dir)
    deleted = sum(clear_database(database) for database in databases)
    return ResetReport(backup=backup, cleared=tuple(db.name for db in databases), rows_deleted=deleted)
