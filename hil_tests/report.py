"""A run's pictures and its one-page summary, from the JSON-lines timelines (`hil_tests/timeline.py`).

A timeline answers every question about a run but nobody reads 5,000 lines. For each scenario this writes
``<scenario>.png`` beside its timeline: the link rate the rig was set to against the goodput the cloud
measured, the gateway's queue depth per priority, the latency of each priority 0 (alert) message, and the
latency of each set point (sent -> applied). ``summary.md`` is one page for the run: per scenario its
pytest outcome and each bound, measured against its limit, pass or fail. The series are computed by pure
functions (testable without matplotlib); only `plot_scenario` draws.

Every series counts a message as the summary does (`hil_tests.timeline`): in the gateway from its ``sent``
to its first ``received`` or ``expired``, whichever observer recorded first; a reception recorded before
its sending (the two observers' threads, not the message) is a stay of zero. Before, `queue_depths` skipped
such a reception, and the plot ended with a backlog of 4 while the summary said 40 of 40 received.

Bounds: every scenario is held to "nothing lost" (sent, never received, not expired); the latency bounds
are the scenarios' own constants (`LATENCY_BOUNDS`), so a changed bound is reported as it is enforced.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hil_tests.history import DEFAULT_TREND_RUNS, Measurement, RunInfo, plot_trends, record_run
from hil_tests.timeline import latency_ms, read_timeline, summarize

RATE_COMMAND = re.compile(r"^RATE\s+(\d+)", re.IGNORECASE)
MEASURE_WINDOW_MS = 1000.0


@dataclass(frozen=True)
class LatencyBound:
    """Every message of ``priority`` (None: the set point records) reaches the cloud within ``limit_s``."""

    name: str
    priority: int | None
    limit_s: float


def latency_bounds() -> dict[str, list[LatencyBound]]:
    """The scenarios' latency bounds by test function name, from the scenario modules' own constants."""
    from hil_tests.scenarios import test_set_point_propagation, test_throughput_drop

    return {
        "test_every_heater_follows_its_set_point_within_the_bound": [
            LatencyBound("set point applied (SET -> relay switch)", None, test_set_point_propagation.HEATER_BOUND_S)
        ],
        "test_alerts_overtake_a_growing_backlog_that_drains_in_priority_order": [
            LatencyBound("alert latency while the link is slow", 0, test_throughput_drop.ALERT_BOUND_S)
        ],
    }


@dataclass(frozen=True)
class BoundResult:
    name: str
    measured: str
    limit: str
    passed: bool
    value: float | None = None  # the measured figure as a number (None: nothing measured), for the history
    bound: float = 0.0
    unit: str = ""


def rate_steps(records: Iterable[dict[str, Any]]) -> list[tuple[float, int]]:
    """(t_ms, bits/s) each time the rig accepted a RATE (0 = unshaped); RESET counts as RATE 0."""
    steps = []
    for record in records:
        if record["event"] != "rig" or not str(record["detail"].get("reply", "")).startswith("OK"):
            continue
        command = str(record["detail"].get("command", ""))
        match = RATE_COMMAND.match(command)
        if match:
            steps.append((record["t_ms"], int(match.group(1))))
        elif command.strip().upper() == "RESET":
            steps.append((record["t_ms"], 0))
    return steps


def down_intervals(records: Iterable[dict[str, Any]], end_ms: float) -> list[tuple[float, float]]:
    """(start, end) t_ms of each time the link was DOWN (until UP or RESET, or the end of the scenario)."""
    intervals, down_since = [], None
    for record in records:
        if record["event"] != "rig" or not str(record["detail"].get("reply", "")).startswith("OK"):
            continue
        verb = str(record["detail"].get("command", "")).strip().upper()
        if verb == "DOWN" and down_since is None:
            down_since = record["t_ms"]
        elif verb in ("UP", "RESET") and down_since is not None:
            intervals.append((down_since, record["t_ms"]))
            down_since = None
    if down_since is not None:
        intervals.append((down_since, end_ms))
    return intervals


def measured_goodput(records: Iterable[dict[str, Any]], window_ms: float = MEASURE_WINDOW_MS) -> list[tuple[float, float]]:
    """(t_ms, bits/s) of message payload reaching the cloud, over the trailing window, per window."""
    arrivals = sorted((r["t_ms"], r["detail"].get("bytes", 0)) for r in records if r["event"] == "received")
    if not arrivals:
        return []
    series = []
    end = arrivals[-1][0]
    t = window_ms
    index = 0
    while t <= end + window_ms:
        total = 0
        while index < len(arrivals) and arrivals[index][0] < t:
            total += arrivals[index][1]
            index += 1
        series.append((t, total * 8 / (window_ms / 1000)))
        t += window_ms
    return series


def queue_depths(records: Iterable[dict[str, Any]]) -> dict[int, list[tuple[float, int]]]:
    """Per priority, (t_ms, messages in the gateway not yet at the cloud nor expired) at each change.

    A message is in from its first ``sent`` until its first ``received`` or ``expired``, never for less
    than nothing (module docstring); changes at the same instant are one point, so the depth never shows a
    spike or a dip that is only the order of two records."""
    entered: dict[str, tuple[int, float]] = {}
    left: dict[str, float] = {}
    for record in records:
        priority, message = record["priority"], record["message_id"]
        if priority is None or record["event"] == "rig":
            continue
        if record["event"] == "sent":
            entered.setdefault(message, (priority, record["t_ms"]))
        elif record["event"] in ("received", "expired"):
            left[message] = min(left.get(message, record["t_ms"]), record["t_ms"])
    changes: dict[int, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for message, (priority, t_in) in entered.items():
        changes[priority][t_in] += 1
        if message in left:
            changes[priority][t_in + latency_ms(t_in, left[message])] -= 1
    depths = {}
    for priority, by_time in changes.items():
        depth, series = 0, []
        for t_ms in sorted(by_time):
            depth += by_time[t_ms]
            series.append((t_ms, depth))
        depths[priority] = series
    return depths


def latencies(records: Iterable[dict[str, Any]], priority: int | None) -> list[tuple[float, float]]:
    """(sent t_ms, latency s) of each message of ``priority`` at its first reception."""
    sent: dict[str, float] = {}
    first: dict[str, float] = {}
    for record in records:
        if record["priority"] != priority or record["event"] == "rig":
            continue
        if record["event"] == "sent":
            sent.setdefault(record["message_id"], record["t_ms"])
        elif record["event"] == "received":
            first.setdefault(record["message_id"], record["t_ms"])
    return sorted((sent[m], latency_ms(sent[m], first[m]) / 1000) for m in first if m in sent)


def check_bounds(scenario: str, records: list[dict[str, Any]], bounds: Mapping[str, list[LatencyBound]]) -> list[BoundResult]:
    results = []
    lost = sum(row.lost for row in summarize(records))
    results.append(BoundResult("nothing lost (sent, never received, not expired)", str(lost), "0", lost == 0,
                               float(lost), 0.0, "messages"))
    function = scenario.split("[", 1)[0]
    for bound in bounds.get(function, []):
        worst = max((latency for _, latency in latencies(records, bound.priority)), default=None)
        measured = "-" if worst is None else f"{worst:.2f} s"
        results.append(BoundResult(bound.name, measured, f"{bound.limit_s:g} s", worst is not None and worst <= bound.limit_s,
                                   worst, bound.limit_s, "s"))
    return results


def plot_scenario(records: list[dict[str, Any]], title: str, path: Path) -> None:
    """Four panels, one shared time axis in seconds; panels without data say so instead of staying blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rate_ax, queue_ax, alert_ax, set_ax) = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    figure.suptitle(title, fontsize=10)
    steps = rate_steps(records)
    goodput = measured_goodput(records)
    end_s = max((r["t_ms"] for r in records), default=0) / 1000
    if steps:
        xs = [t / 1000 for t, _ in steps] + [end_s]
        ys = [rate / 1000 if rate else float("nan") for _, rate in steps]
        rate_ax.step(xs, ys + ys[-1:], where="post", label="RATE set (kbit/s; gap = unshaped)")
    if goodput:
        rate_ax.step([t / 1000 for t, _ in goodput], [bps / 1000 for _, bps in goodput], where="pre",
                     label="payload at the cloud (kbit/s over 1 s)")
    downs = down_intervals(records, end_s * 1000)
    for number, (start, stop) in enumerate(downs):
        for axis in (rate_ax, queue_ax, alert_ax):
            axis.axvspan(start / 1000, stop / 1000, color="red", alpha=0.12, label="DOWN" if number == 0 and axis is rate_ax else None)
    for record in records:
        command = str(record["detail"].get("command", "")) if record["event"] == "rig" else ""
        if command.split(" ", 1)[0].upper() in ("DELAY", "JITTER", "LOSS"):
            rate_ax.annotate(command, (record["t_ms"] / 1000, 0), fontsize=7, rotation=90, va="bottom")
    _finish(rate_ax, "link", bool(steps or goodput or downs))
    for priority, series in sorted(queue_depths(records).items()):
        queue_ax.step([t / 1000 for t, _ in series], [d for _, d in series], where="post", label=f"P{priority}")
    _finish(queue_ax, "queued in the gateway (messages)", bool(queue_depths(records)))
    alerts = latencies(records, 0)
    alert_ax.plot([t / 1000 for t, _ in alerts], [s for _, s in alerts], "o", label="P0 latency (s)")
    _finish(alert_ax, "alerts", bool(alerts))
    set_points = latencies(records, None)
    set_ax.plot([t / 1000 for t, _ in set_points], [s for _, s in set_points], "x", label="set point applied after (s)")
    _finish(set_ax, "set points", bool(set_points))
    set_ax.set_xlabel("time since the scenario started (s)")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def _finish(axis: Any, name: str, has_data: bool) -> None:
    axis.set_ylabel(name, fontsize=8)
    if has_data:
        axis.legend(fontsize=7, loc="upper right")
    else:
        axis.text(0.5, 0.5, f"no {name} data in this scenario", transform=axis.transAxes, ha="center", color="grey")


def write_run_report(
    folder: Path, outcomes: Mapping[str, str], history: Path | None = None, run: RunInfo | None = None,
    trend_runs: int = DEFAULT_TREND_RUNS,
) -> Path:
    """Plot every timeline of ``folder`` and write ``folder/summary.md``; returns the summary's path.

    With ``history`` and ``run``, the run's bounds are recorded in that database (`hil_tests.history`) and
    a trend plot per figure over the last ``trend_runs`` runs is drawn into ``folder`` too."""
    bounds = latency_bounds()
    lines = [f"# HIL run {folder.name}", "", "| scenario | pytest | bound | measured | limit | |", "|---|---|---|---|---|---|"]
    measurements = []
    for timeline in sorted(folder.glob("*.jsonl")):
        records = read_timeline(timeline)
        if not records:
            continue
        scenario = records[0]["scenario"]
        plot_scenario(records, f"{folder.name} / {scenario}", timeline.with_suffix(".png"))
        outcome = outcomes.get(scenario, "?")
        for result in check_bounds(scenario, records, bounds):
            mark = "pass" if result.passed else "FAIL"
            lines.append(f"| {scenario} | {outcome} | {result.name} | {result.measured} | {result.limit} | {mark} |")
            measurements.append(Measurement(scenario, result.name, result.value, result.bound, result.unit,
                                            result.passed, outcome))
    lines += ["", "Plots: `<scenario>.png` beside each timeline (rate set vs measured, queue depth per priority,",
              "P0 latency, set point latency). Timelines: `<scenario>.jsonl`."]
    if history is not None and run is not None:
        record_run(history, run, measurements)
        trends = plot_trends(history, folder, trend_runs)
        lines += ["", f"History: `{history}` (bench {run.bench}); trends over the last {trend_runs} runs, the bound "
                  "dashed: " + ", ".join(f"`{path.name}`" for path in trends)]
    summary = folder / "summary.md"
    summary.write_text("\n".join(lines) + "\n")
    return summary
