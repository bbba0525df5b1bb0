"""What happened during a HIL scenario, as JSON lines, and the summary table printed after a run.

Every scenario writes one file ``<artifacts>/<run id>/<scenario>.jsonl``; each line is one record with the
same keys: ``run_id, scenario, message_id, priority, device, event, t_ms, detail``. ``event`` is ``sent``,
``received``, ``expired`` (a message the cloud must never see because its TTL passed) or ``rig`` (a rig
command and its reply, with ``message_id``/``priority``/``device`` null). ``t_ms`` counts milliseconds from
the scenario's start on a monotonic clock, so records of one scenario compare directly even if the wall
clock jumps. These files are the input of the data pipeline's HIL report, so the writer validates each
record before writing it and flushes every line: a crashed scenario still leaves a readable timeline.

``sent`` and ``received`` are seen by two observers on the same clock: the tap on the gateway's broker and
the collector on the cloud's, each on its own paho thread. A message the gateway forwards at once can
reach the collector before the tap's thread records it, so its ``received`` may come a millisecond or two
*before* its ``sent`` (4 of 40 set-point scenario messages, 0.5-1.9 ms). That is the observers' order,
not the message's: `latency_ms` counts such a message as sent when it was received (latency 0), here and
in the run report, so a table and a plot of the same records agree.

`summarize` and `format_summary` are pure: they turn records into per-priority rows (sent, received,
expired, lost, duplicates, latency percentiles) and rows into a text table.
"""

from __future__ import annotations

import json
import re
import secrets
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

EVENTS = ("sent", "received", "expired", "rig")
MESSAGE_EVENTS = ("sent", "received", "expired")
FIELDS = ("run_id", "scenario", "message_id", "priority", "device", "event", "t_ms", "detail")


def new_run_id() -> str:
    """Sortable and unique: UTC time of the run plus a random suffix for runs started the same second."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


def scenario_file_name(scenario: str) -> str:
    """A file name for a scenario's node name, such as
    ``test_a_satellite_backlog_drains_with_the_window_full_and_alerts_first[userspace]`` (no slashes,
    brackets or spaces)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", scenario).strip("_") + ".jsonl"


class Timeline:
    """Appends the records of one scenario to its JSON-lines file."""

    def __init__(
        self, path: Path, run_id: str, scenario: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.run_id = run_id
        self.scenario = scenario
        self._clock = clock
        self._start = clock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115  # open while the timeline is

    def record(
        self,
        event: str,
        *,
        message_id: str | None = None,
        priority: int | None = None,
        device: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if event not in EVENTS:
            raise ValueError(f"event must be one of {', '.join(EVENTS)}, got {event!r}")
        if event in MESSAGE_EVENTS and not message_id:
            raise ValueError(f"a {event!r} record needs a message_id")
        valid_priority = isinstance(priority, int) and not isinstance(priority, bool) and 0 <= priority <= 9
        if priority is not None and not valid_priority:
            raise ValueError(f"priority must be 0..9 or None, got {priority!r}")
        entry = {
            "run_id": self.run_id,
            "scenario": self.scenario,
            "message_id": message_id,
            "priority": priority,
            "device": device,
            "event": event,
            "t_ms": round((self._clock() - self._start) * 1000, 3),
            "detail": detail or {},
        }
        self._file.write(json.dumps(entry) + "\n")  # TypeError here if detail is not JSON: caught before a bad line
        self._file.flush()
        return entry

    def sent(self, message_id: str, priority: int, device: str, **detail: Any) -> dict[str, Any]:
        return self.record("sent", message_id=message_id, priority=priority, device=device, detail=detail)

    def received(self, message_id: str, priority: int, device: str, **detail: Any) -> dict[str, Any]:
        return self.record("received", message_id=message_id, priority=priority, device=device, detail=detail)

    def expired(self, message_id: str, priority: int, device: str, **detail: Any) -> dict[str, Any]:
        return self.record("expired", message_id=message_id, priority=priority, device=device, detail=detail)

    def rig(self, command: str, reply: str) -> dict[str, Any]:
        """Log a rig command; has the signature of `RigClient.on_command`."""
        return self.record("rig", detail={"command": command, "reply": reply})

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Timeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TimelineRun:
    """The artifacts folder of one run: ``<root>/<run id>/``, one timeline per scenario."""

    def __init__(self, root: Path, run_id: str | None = None) -> None:
        self.run_id = run_id or new_run_id()
        self.folder = root / self.run_id
        self.folder.mkdir(parents=True, exist_ok=True)

    def timeline(self, scenario: str) -> Timeline:
        return Timeline(self.folder / scenario_file_name(scenario), self.run_id, scenario)

    def records(self) -> list[dict[str, Any]]:
        return [record for path in sorted(self.folder.glob("*.jsonl")) for record in read_timeline(path)]


def read_timeline(path: Path) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON: {error}") from None
        if not isinstance(record, dict) or set(record) != set(FIELDS):
            raise ValueError(f"{path}:{number}: expected the keys {', '.join(FIELDS)}")
        records.append(record)
    return records


@dataclass(frozen=True)
class SummaryRow:
    scenario: str
    priority: int | None
    sent: int
    received: int  # distinct messages received
    expired: int
    lost: int  # sent, never received, not expired
    duplicates: int  # receptions beyond the first
    p50_ms: float | None  # latency sent -> first reception
    p95_ms: float | None
    max_ms: float | None
    rig_commands: int


def latency_ms(sent_ms: float, received_ms: float) -> float:
    """Sent to received; a reception seen before its sending (two observers, module docstring) is 0."""
    return max(0.0, received_ms - sent_ms)


def summarize(records: Iterable[dict[str, Any]]) -> list[SummaryRow]:
    """One row per scenario and priority (rig commands are counted on every row of their scenario)."""
    by_scenario: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_scenario[record["scenario"]].append(record)
    rows = []
    for scenario, scenario_records in sorted(by_scenario.items()):
        rig_commands = sum(1 for r in scenario_records if r["event"] == "rig")
        messages = [r for r in scenario_records if r["event"] in MESSAGE_EVENTS]
        priorities = sorted({r["priority"] for r in messages}, key=lambda p: (p is None, p))
        if not priorities:
            rows.append(SummaryRow(scenario, None, 0, 0, 0, 0, 0, None, None, None, rig_commands))
        for priority in priorities:
            rows.append(_row(scenario, priority, [r for r in messages if r["priority"] == priority], rig_commands))
    return rows


def _row(scenario: str, priority: int | None, records: list[dict[str, Any]], rig_commands: int) -> SummaryRow:
    sent_at: dict[str, float] = {}
    received_at: dict[str, list[float]] = defaultdict(list)
    expired: set[str] = set()
    for record in records:
        message_id = record["message_id"]
        if record["event"] == "sent":
            sent_at.setdefault(message_id, record["t_ms"])
        elif record["event"] == "received":
            received_at[message_id].append(record["t_ms"])
        else:
            expired.add(message_id)
    latencies = sorted(latency_ms(sent_at[m], min(times)) for m, times in received_at.items() if m in sent_at)
    lost = sum(1 for m in sent_at if m not in received_at and m not in expired)
    return SummaryRow(
        scenario=scenario,
        priority=priority,
        sent=len(sent_at),
        received=len(received_at),
        expired=len(expired),
        lost=lost,
        duplicates=sum(len(times) - 1 for times in received_at.values()),
        p50_ms=statistics.median(latencies) if latencies else None,
        p95_ms=_percentile(latencies, 95) if latencies else None,
        max_ms=latencies[-1] if latencies else None,
        rig_commands=rig_commands,
    )


def _percentile(ordered: list[float], percent: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, -(-len(ordered) * percent // 100))
    return ordered[int(rank) - 1]


def format_summary(rows: Iterable[SummaryRow]) -> str:
    headers = ("scenario", "prio", "sent", "recv", "expired", "lost", "dup", "p50 ms", "p95 ms", "max ms", "rig")
    table = [headers]
    for row in rows:
        table.append(
            (
                row.scenario,
                "-" if row.priority is None else str(row.priority),
                str(row.sent),
                str(row.received),
                str(row.expired),
                str(row.lost),
                str(row.duplicates),
                *("-" if value is None else f"{value:.0f}" for value in (row.p50_ms, row.p95_ms, row.max_ms)),
                str(row.rig_commands),
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(width) if i == 0 else cell.rjust(width) for i, (cell, width) in enumerate(zip(line, widths, strict=True)))
        for line in table
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
