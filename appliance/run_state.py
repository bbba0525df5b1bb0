"""``gateway.json`` in the data directory: how the command-line tools find the gateway running on a data
directory - its pid (``appliance routes reload`` signals it), the address of its Prometheus page
(``appliance doctor`` scrapes it; with ``metrics_port = 0`` only the running gateway knows the port) and
its listeners' URLs in config order, with the ports they bound (``appliance state``/``firmware`` connect
there: ``appliance/tool_connection.py``).
The gateway writes it once it is ready and removes it when it stops; a file left by a killed gateway
names a process that is gone, which ``running`` reports as no gateway rather than signalling a stranger.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from appliance import atomic_file

FILE_NAME = "gateway.json"


@dataclass(frozen=True, slots=True)
class RunState:
    pid: int
    metrics_url: str | None
    listeners: tuple[str, ...] = ()


def write(data_dir: Path, metrics_url: str | None, listeners: list[str] | None = None) -> None:
    document = {"pid": os.getpid(), "metrics_url": metrics_url, "listeners": listeners or []}
    atomic_file.write_bytes(data_dir / FILE_NAME, (json.dumps(document) + "\n").encode())


def remove(data_dir: Path) -> None:
    (data_dir / FILE_NAME).unlink(missing_ok=True)


def running(data_dir: Path) -> RunState | None:
    """The gateway running on ``data_dir``, or None if none is (no file, a damaged one, or its process is
    gone)."""
    try:
        document = json.loads((data_dir / FILE_NAME).read_text())
        state = RunState(int(document["pid"]), document.get("metrics_url"),
                         tuple(str(url) for url in document.get("listeners", ())))
        os.kill(state.pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state
