"""``broker.db`` files as older gateways wrote them, so that each migration is tested from what is really
on disk, not from today's schema with an old version number (mosquitto keeps such files in
``test/unit/files/persist_read/``). ``data/broker-v2.sql`` is a dump of a file the version 2 gateway wrote
(its header says how)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

VERSION_2_DUMP = Path(__file__).parent / "data" / "broker-v2.sql"


def write_version_2(path: Path, with_rows: bool = True) -> None:
    """Create ``path`` as the version 2 gateway left it; ``with_rows=False``: its tables only, empty."""
    script = VERSION_2_DUMP.read_text()
    if not with_rows:
        script = "\n".join(line for line in script.splitlines()
                           if not line.startswith("INSERT INTO") or line.startswith('INSERT INTO "meta"'))
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path)) as connection:
        connection.executescript(script)
