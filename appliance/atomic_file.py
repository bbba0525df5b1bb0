"""Replacing a file so that a crash or a power cut leaves either the old file or the whole new one, never
a truncated mix: the new content goes to a temporary file beside the target, is flushed and fsynced,
renamed over the target, and the directory is fsynced so the rename itself survives a power cut
(mosquitto's ``persist__backup`` does the same). The one way the gateway replaces a file: the password
file (a torn one would lock every user out), factory-reset backups and the forwarding status file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def replacing(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Write the new content of ``path`` to the handle this yields; on a clean exit it replaces ``path``
    (with permissions ``mode``), on an exception the old file stays and the temporary one is removed."""
    directory = path.resolve().parent
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    fsync_directory(directory)


def write_bytes(path: Path, content: bytes, mode: int = 0o644) -> None:
    with replacing(path, mode) as handle:
        handle.write(content)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
