"""The landing zone on disk: date/hour partitions of JSON-lines files, and how a write becomes durable.

Layout, by cloud receive time in UTC::

    LANDING/{events,metrics,quarantine}/date=YYYY-MM-DD/hour=HH/part-<writer>-<opened ms>-<seq>.jsonl

A file is written under a hidden name (``.part-....jsonl.inprogress``) and renamed to its final name when
it is sealed. Spark skips names that start with a dot, and the jobs read only ``*.jsonl``, so the Spark
streaming file source, which reads every file once, never sees a file that can still grow.

``commit()`` flushes and fsyncs every open file (and, once, the directory of a new file): the ingest
acknowledges a message upstream only after the commit that covers its line returned. A crash can leave
an in-progress file whose last line is cut short; ``recover()`` (run when a writer opens) truncates it to
the last whole line and seals it. The lost line belonged to a message that was never acknowledged, so
the broker delivers it again. Lines written but not yet acknowledged are delivered again too, and the
jobs drop the duplicates by message id.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline.records import KINDS

INPROGRESS_SUFFIX = ".jsonl.inprogress"
SEALED_GLOB = "date=*/hour=*/*.jsonl"


def partition_of(received_ms: int) -> tuple[str, str]:
    """(date, hour) of the partition a message received at ``received_ms`` lands in."""
    at = datetime.fromtimestamp(received_ms / 1000, tz=UTC)
    return at.strftime("%Y-%m-%d"), at.strftime("%H")


def safe_writer_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "writer"


_OPENED_MS = re.compile(r"-(\d+)-\d+(?:\.jsonl|\.jsonl\.inprogress)$")


def opened_ms_of(name: str) -> int | None:
    """The opening time in a landing file's name (``part-<writer>-<opened ms>-<seq>.jsonl``, or its
    in-progress name); None for a name of another form."""
    found = _OPENED_MS.search(name)
    return int(found.group(1)) if found else None


def sealed_files(root: Path | str, kind: str) -> list[Path]:
    return sorted(Path(root, kind).glob(SEALED_GLOB))


def read_records(root: Path | str, kind: str) -> list[dict]:
    """Every record in the sealed files of one kind (for tests and small tools, not for the jobs)."""
    records = []
    for path in sealed_files(root, kind):
        with path.open(encoding="utf-8") as lines:
            records.extend(json.loads(line) for line in lines if line.strip())
    return records


@dataclass
class _OpenFile:
    path: Path
    handle: object
    opened_s: float
    size: int = 0
    synced: bool = False  # has been fsynced (and its directory entry with it) at least once


class LandingWriter:
    """Appends records to the landing zone; one writer per ingest process (``writer_id`` names its files)."""

    def __init__(self, root: Path | str, writer_id: str, roll_bytes: int = 64 << 20, roll_seconds: float = 60.0):
        self.root = Path(root)
        self.writer_id = safe_writer_id(writer_id)
        self.roll_bytes = roll_bytes
        self.roll_seconds = roll_seconds
        self._open: dict[tuple[str, str, str], _OpenFile] = {}
        self._seq = 0
        for kind in KINDS:
            (self.root / kind).mkdir(parents=True, exist_ok=True)
        self.recovered = self.recover()

    # -- writing ---------------------------------------------------------------------------------------
    def append(self, kind: str, record: dict) -> None:
        """Write one record; durable only after the next ``commit()``."""
        date, hour = partition_of(record["received_ms"])
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
        file = self._file_for(kind, date, hour)
        file.handle.write(line)
        file.size += len(line)

    def commit(self) -> None:
        """Make every appended record durable, then seal the files that are due."""
        for file in self._open.values():
            file.handle.flush()
            os.fsync(file.handle.fileno())
            if not file.synced:
                _fsync_dir(file.path.parent)
                file.synced = True
        self.roll_due()

    def roll_due(self, now_s: float | None = None) -> None:
        """Seal files that are big or old enough, or whose hour is over. Call it now and then, even idle."""
        now_s = time.time() if now_s is None else now_s
        current = partition_of(int(now_s * 1000))
        for key, file in list(self._open.items()):
            if file.size >= self.roll_bytes or now_s - file.opened_s >= self.roll_seconds or key[1:] < current:
                self._seal(key)

    def close(self) -> None:
        self.commit()
        for key in list(self._open):
            self._seal(key)

    # -- files -----------------------------------------------------------------------------------------
    def _file_for(self, kind: str, date: str, hour: str) -> _OpenFile:
        key = (kind, date, hour)
        file = self._open.get(key)
        if file is None:
            folder = self.root / kind / f"date={date}" / f"hour={hour}"
            folder.mkdir(parents=True, exist_ok=True)
            self._seq += 1
            opened = time.time()
            path = folder / f".part-{self.writer_id}-{int(opened * 1000)}-{self._seq:06d}{INPROGRESS_SUFFIX}"
            file = self._open[key] = _OpenFile(path, path.open("ab"), opened)
        return file

    def _seal(self, key: tuple[str, str, str]) -> None:
        file = self._open.pop(key)
        file.handle.flush()
        os.fsync(file.handle.fileno())
        file.handle.close()
        if file.size == 0:
            file.path.unlink()
            return
        _seal_path(file.path)

    def recover(self) -> list[Path]:
        """Seal this writer's in-progress files left by a crash, cut to their last whole line."""
        sealed = []
        for path in self.root.glob(f"*/date=*/hour=*/.part-{self.writer_id}-*{INPROGRESS_SUFFIX}"):
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if len(whole) != len(data):
                with path.open("r+b") as handle:
                    handle.truncate(len(whole))
                    os.fsync(handle.fileno())
            if whole:
                sealed.append(_seal_path(path))
            else:
                path.unlink()
        return sealed


def _seal_path(path: Path) -> Path:
    final = path.with_name(path.name[1 : -len(INPROGRESS_SUFFIX)] + ".jsonl")
    os.replace(path, final)
    _fsync_dir(path.parent)
    return final


# appliance.atomic_file.fsync_directory's twin, on purpose: the Spark side imports this module and nothing of
# appliance (tests/pipeline/test_imports.py).
def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
