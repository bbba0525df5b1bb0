"""What ``appliance doctor`` can tell about store-and-forward from the files the gateway keeps in its data
directory - so it works without a metrics port, without credentials for the broker, and on a gateway that
refuses to start.

* The manifest itself (``load_manifest``): it parses and names at least one route.
* ``forwarding-routes.json``: what the running gateway loaded - its last error, how many routes run.
* ``forwarding-metrics.json``: the metrics document (docs/message-format.md), rewritten every
  ``metrics_interval_s``: the link and since when it is up or down, each queue's depth, oldest age and the
  TTL that message was stored with, the store's health and, per endpoint, whether its pump runs and when
  its head last moved. A key the document lacks (a gateway older than the check) is not a problem.
* ``forwarding.db``, read-only: the dead letters.

Each check returns findings; time is an argument (``now_ms``), so the thresholds are tested on documents
written for the purpose as well as on a running gateway.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from appliance.findings import Finding, Verdict
from appliance.forwarding.config import ForwardingConfig
from appliance.forwarding.manifest import ManifestError, load_manifest
from appliance.forwarding.routes import UPSTREAM
from appliance.forwarding.service import METRICS_FILE, STATUS_FILE, STORE_FILE

CHECK = "forwarding"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a state that is normal for a while becomes a problem."""

    #: The cloud link may be down this long (a cellular or satellite link drops for minutes).
    link_down_s: float = 300.0
    #: A pump whose queue is not empty may go this long without moving its head while its link is up.
    stalled_s: float = 300.0
    #: A queue whose oldest message has lived this fraction of its TTL is losing messages soon.
    ttl_fraction: float = 0.5


DEFAULT_THRESHOLDS = Thresholds()


def _age(now_ms: int, then_ms: int) -> str:
    seconds = max(0, now_ms - then_ms) // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def check_manifest(config: ForwardingConfig) -> list[Finding]:
    """The manifest file on disk: the one the next start or reload reads."""
    if config.manifest is None:
        return [Finding(CHECK, Verdict.PROBLEM, "forwarding is enabled but [forwarding] manifest names no file: "
                                                "no message is routed")]
    try:
        manifest = load_manifest(config.manifest)
    except ManifestError as exc:
        return [Finding(CHECK, Verdict.PROBLEM, f"manifest {config.manifest} is not valid: {exc}")]
    if not manifest.routes:
        return [Finding(CHECK, Verdict.PROBLEM, f"manifest {config.manifest} has no routes: every device message "
                                                "is accepted and dropped")]
    return [Finding(CHECK, Verdict.OK, f"manifest {config.manifest}: {len(manifest.routes)} routes")]


def check_running_routes(data_dir: Path, gateway_pid: int | None) -> list[Finding]:
    """What the running gateway loaded (``forwarding-routes.json``); nothing to say without one."""
    if gateway_pid is None:
        return []
    status = _read_json(data_dir / STATUS_FILE)
    if status is None or status.get("pid") != gateway_pid:
        return [Finding(CHECK, Verdict.PROBLEM, f"the running gateway (pid {gateway_pid}) has written no "
                                                f"{STATUS_FILE}: it has not loaded routes")]
    routes = status.get("routes") or []
    findings = []
    if status.get("error"):
        findings.append(Finding(CHECK, Verdict.PROBLEM, f"the running gateway rejected its manifest and runs "
                                                        f"{len(routes)} earlier routes: {status['error']}"))
    if not routes:
        findings.append(Finding(CHECK, Verdict.PROBLEM, "the running gateway has no routes loaded: every device "
                                                        "message is accepted and dropped"))
    elif not findings:
        findings.append(Finding(CHECK, Verdict.OK, f"the running gateway routes with {len(routes)} routes"))
    return findings


def check_metrics_document(data_dir: Path, now_ms: int, gateway_pid: int | None, interval_s: float,
                           thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Finding]:
    """The link, the queues, the store and the pumps as the running gateway last reported them."""
    if gateway_pid is None:
        return []
    path = data_dir / METRICS_FILE
    document = _read_json(path)
    if document is None or not isinstance(document.get("ts_ms"), int):
        return [Finding(CHECK, Verdict.PROBLEM, f"the running gateway (pid {gateway_pid}) has written no {path}")]
    written_ms: int = document["ts_ms"]
    if now_ms - written_ms > (3 * interval_s + 30) * 1000:
        return [Finding(CHECK, Verdict.PROBLEM, f"{path} was last written {_age(now_ms, written_ms)} ago (every "
                                                f"{interval_s:g} s expected): forwarding is stuck")]
    links = document.get("links") or {}
    endpoints = document.get("endpoints") or {}
    started = document.get("started_ms")
    started_ms = started if isinstance(started, int) else written_ms
    try:
        return [*_links(links, now_ms, thresholds), *_queues(endpoints, (now_ms - written_ms) / 1000, thresholds),
                *_store(document.get("store")),
                *_pumps(document.get("pump"), links, endpoints, now_ms, started_ms, thresholds)]
    except (TypeError, ValueError, AttributeError) as exc:  # a damaged file, not what the gateway writes
        return [Finding(CHECK, Verdict.PROBLEM, f"{path} is damaged ({exc!r}): is the disk failing?")]


def _links(links: dict[str, Any], now_ms: int, thresholds: Thresholds) -> list[Finding]:
    findings = []
    for name, link in sorted(links.items()):
        since = link.get("since_ms")
        if link.get("connected"):
            findings.append(Finding(CHECK, Verdict.OK, f"{name} link up" + (
                f" for {_age(now_ms, since)}" if isinstance(since, int) else "")))
        elif not isinstance(since, int):
            findings.append(Finding(CHECK, Verdict.UNKNOWN, f"{name} link down, since when is not reported"))
        elif now_ms - since > thresholds.link_down_s * 1000:
            findings.append(Finding(CHECK, Verdict.PROBLEM, f"{name} link down for {_age(now_ms, since)} (since "
                                                            f"{_when(since)}): messages queue up and expire unsent"))
        else:
            findings.append(Finding(CHECK, Verdict.OK, f"{name} link down for {_age(now_ms, since)} (a problem "
                                                       f"after {thresholds.link_down_s:g} s)"))
    return findings


def _queues(endpoints: dict[str, Any], since_written_s: float, thresholds: Thresholds) -> list[Finding]:
    """A message still queued when the document was written has aged ``since_written_s`` more by now."""
    findings = []
    waiting = 0
    for endpoint, priorities in sorted(endpoints.items()):
        for priority, row in sorted(priorities.items(), key=lambda item: int(item[0])):
            depth, ttl = row.get("depth", 0), row.get("oldest_ttl_s", 0)
            age = row.get("oldest_age_s", 0) + since_written_s
            waiting += depth
            if depth and ttl and age > ttl * thresholds.ttl_fraction:
                findings.append(Finding(CHECK, Verdict.PROBLEM, (
                    f"queue {endpoint}_Pri{priority}: the oldest of {depth} messages is {age:.0f} s old of its "
                    f"{ttl} s TTL: it expires unsent unless the queue drains faster")))
    if not findings:
        findings.append(Finding(CHECK, Verdict.OK, f"{waiting} messages queued, none past "
                                                   f"{thresholds.ttl_fraction:.0%} of its TTL"))
    return findings


def _store(store: Any) -> list[Finding]:
    if not isinstance(store, dict) or store.get("healthy", True):
        return []
    full = " (the disk is full)" if store.get("disk_full") else ""
    return [Finding(CHECK, Verdict.PROBLEM, f"{STORE_FILE} cannot commit{full}: device messages are refused "
                                            f"({store.get('failed_commits', '?')} failed commits)")]


def _pumps(pumps: Any, links: dict[str, Any], endpoints: dict[str, Any], now_ms: int, started_ms: int,
           thresholds: Thresholds) -> list[Finding]:
    if not isinstance(pumps, dict):
        return []
    findings = []
    for endpoint, pump in sorted(pumps.items()):
        restarts = pump.get("restarts", 0)
        if not pump.get("running", True):
            findings.append(Finding(CHECK, Verdict.PROBLEM, f"the pump of {endpoint} is not running "
                                                            f"({restarts} restarts): its queues do not drain"))
            continue
        queued = sum(row.get("depth", 0) for row in (endpoints.get(endpoint) or {}).values())
        # A module input is local: its "link" is up from the start.
        link = links.get(endpoint) if endpoint == UPSTREAM else {"connected": True, "since_ms": started_ms}
        moved = pump.get("head_moved_ms")
        if link is None or not link.get("connected") or not queued:
            continue
        # Only while the link has been up the whole time: a link that just came back has not had its chance.
        up_since = max(link.get("since_ms") or started_ms, moved if isinstance(moved, int) else started_ms)
        if now_ms - up_since > thresholds.stalled_s * 1000:
            last = f"last moved {_age(now_ms, moved)} ago" if isinstance(moved, int) else "never moved"
            findings.append(Finding(CHECK, Verdict.PROBLEM, f"the pump of {endpoint} is stalled: {queued} messages "
                                                            f"queued, the link is up, its head {last}"))
        elif restarts:
            findings.append(Finding(CHECK, Verdict.OK, f"the pump of {endpoint} runs ({restarts} restarts)"))
    return findings


def check_dead_letters(data_dir: Path) -> list[Finding]:
    """Messages an endpoint kept refusing (read-only: the gateway may be writing)."""
    path = data_dir / STORE_FILE
    if not path.exists():
        return []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = db.execute(
                "SELECT endpoint, COUNT(*), MAX(dead_ms), (SELECT reason FROM dead_letters AS newest "
                "WHERE newest.endpoint = dead_letters.endpoint ORDER BY id DESC LIMIT 1) "
                "FROM dead_letters GROUP BY endpoint ORDER BY endpoint"
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error as exc:
        if "no such table" in str(exc):
            return []
        return [Finding(CHECK, Verdict.UNKNOWN, f"cannot read the dead letters in {path}: {exc}")]
    if not rows:
        return [Finding(CHECK, Verdict.OK, "no dead letters")]
    return [
        Finding(CHECK, Verdict.PROBLEM, (
            f"{count} dead letters for {endpoint}, the newest {_when(newest)} (latest reason: {reason}): "
            "`appliance routes dead-letters` lists them, `--clear` removes them once handled"))
        for endpoint, count, newest, reason in rows
    ]
