"""The bench's history (issue 26 section 10): runs recorded in one SQLite database, a trend per figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hil_tests.bench import DEFAULT_BENCH, BenchConfigError, load_bench
from hil_tests.history import Measurement, RunInfo, record_run, trend
from hil_tests.report import write_run_report
from hil_tests.timeline import Timeline

SCENARIO = "test_alerts_overtake_a_growing_backlog_that_drains_in_priority_order[message]"
FIGURE = "alert latency while the link is slow"


def _run(root: Path, run_id: str, alert_latency_s: float, bench: str = "lab-1") -> tuple[Path, RunInfo]:
    """A run folder with one throughput-drop timeline whose only alert took ``alert_latency_s``."""
    folder = root / run_id
    ticks = iter([0.0, 0.1, 0.1 + alert_latency_s])
    with Timeline(folder / "throughput.jsonl", run_id, SCENARIO, clock=lambda: next(ticks)) as timeline:
        timeline.sent("a/alerts/1@1", 0, "t0")
        timeline.received("a/alerts/1@1", 0, "t0", bytes=80)
    started = f"2026-11-{int(run_id[-2:]):02d}T06:00:00+00:00"
    return folder, RunInfo(run_id, started, bench, "bridge on /dev/hil-rig", "0.1.0+abc1234", "0.1.0")


def test_every_run_is_recorded_once_and_the_trend_shows_the_drift_with_its_bound(tmp_path: Path) -> None:
    database = tmp_path / "history.db"
    for day, latency in ((1, 1.5), (2, 1.9), (3, 2.4), (4, 3.2)):
        folder, run = _run(tmp_path, f"run-{day:02d}", latency)
        summary = write_run_report(folder, {SCENARIO: "passed" if latency <= 3 else "failed"}, database, run, 3)
    write_run_report(folder, {SCENARIO: "failed"}, database, run, 3)  # the same run reported again
    points = trend(database, SCENARIO, FIGURE, last=3)
    assert [(p.run_id, p.value, p.bound, p.passed) for p in points] == [
        ("run-02", pytest.approx(1.9), 3.0, True), ("run-03", pytest.approx(2.4), 3.0, True),
        ("run-04", pytest.approx(3.2), 3.0, False),
    ]
    # What a lab types: sqlite-utils' own command line reads the same database.
    query = subprocess.run(
        [str(Path(sys.executable).parent / "sqlite-utils"), "query", str(database),
         "select run_id, figure, value, bound, passed, outcome from measurements where figure = :f order by run_id",
         "-p", "f", FIGURE], capture_output=True, text=True, check=True,
    )
    rows = json.loads(query.stdout)
    assert [row["run_id"] for row in rows] == ["run-01", "run-02", "run-03", "run-04"]
    assert rows[-1]["outcome"] == "failed" and rows[-1]["passed"] == 0
    runs = subprocess.run([str(Path(sys.executable).parent / "sqlite-utils"), "rows", str(database), "runs"],
                          capture_output=True, text=True, check=True)
    assert {run["gateway_version"] for run in json.loads(runs.stdout)} == {"0.1.0+abc1234"}
    (trend_plot,) = folder.glob("trend-test_alerts_*-alert_latency_while_the_link_is_slow.png")
    assert trend_plot.read_bytes().startswith(b"\x89PNG")
    assert trend_plot.name in summary.read_text()


def test_each_point_keeps_the_bound_of_its_run_and_benches_are_counted_apart(tmp_path: Path) -> None:
    database = tmp_path / "history.db"
    for day, bench in ((1, "lab-1"), (2, "lab-2"), (3, "lab-1"), (4, "lab-2"), (5, "lab-1")):
        bound = 3.0 if day < 4 else 2.5  # the scenario's bound tightened after day 3
        _, run = _run(tmp_path, f"run-{day:02d}", 0, bench)
        record_run(database, run, [Measurement(SCENARIO, FIGURE, 1.0 + day / 10, bound, "s", True, "passed")])
    points = trend(database, SCENARIO, FIGURE, last=2)  # the last two runs of each bench
    assert [(p.run_id, p.bench, p.bound) for p in points] == [
        ("run-02", "lab-2", 3.0), ("run-03", "lab-1", 3.0), ("run-04", "lab-2", 2.5), ("run-05", "lab-1", 2.5)
    ]
    assert trend(database, SCENARIO, "no such figure") == [] and trend(tmp_path / "empty.db", SCENARIO, FIGURE) == []


def test_the_bench_file_names_the_history_or_defaults_beside_the_artifacts(tmp_path: Path) -> None:
    default = load_bench(DEFAULT_BENCH)
    assert default.history.database == default.artifacts_dir / "history.db"
    assert default.history.bench == "bench" and default.history.trend_runs == 20
    text = DEFAULT_BENCH.read_text().replace('dir = "', 'dir = "' + str(DEFAULT_BENCH.parent) + "/", 1)
    custom = tmp_path / "lab.toml"
    custom.write_text(text + '\n[history]\ndatabase = "shared/history.db"\nbench = "lab-1"\ntrend_runs = 5\n')
    history = load_bench(custom).history
    assert (history.database, history.bench, history.trend_runs) == (tmp_path / "shared/history.db", "lab-1", 5)
    for bad in ('trend_runs = 0', 'bench = 5', 'colour = "red"'):
        custom.write_text(text + f"\n[history]\n{bad}\n")
        with pytest.raises(BenchConfigError, match="history"):
            load_bench(custom)
