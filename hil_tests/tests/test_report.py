"""The run report: series computed from timeline records, bounds judged, plots and summary.md written."""

from __future__ import annotations

from pathlib import Path

from hil_tests.report import (
    LatencyBound,
    check_bounds,
    latencies,
    measured_goodput,
    queue_depths,
    rate_steps,
    write_run_report,
)
from hil_tests.timeline import Timeline

SCENARIO = "test_alerts_overtake_a_growing_backlog_that_drains_in_priority_order[message]"


def _records(path: Path) -> list[dict]:
    clock = iter([0.0] + [n / 10 for n in range(1, 100)])
    with Timeline(path, "run-1", SCENARIO, clock=lambda: next(clock)) as timeline:
        timeline.rig("RATE 9600", "OK RATE 9600")  # t = 0.1 s
        timeline.sent("a/alerts/1@1", 0, "t0")  # 0.2
        timeline.sent("d/data/1@1", 1, "t1")  # 0.3
        timeline.sent("d/data/2@1", 1, "t1")  # 0.4
        timeline.received("a/alerts/1@1", 0, "t0", bytes=100)  # 0.5: alert latency 0.3 s
        timeline.rig("RATE 5", "ERR nope")  # refused: not a step
        timeline.received("d/data/1@1", 1, "t1", bytes=200)  # 0.7
        timeline.expired("d/data/2@1", 1, "t1")  # 0.8
        timeline.sent("d/data/3@1", 1, "t1")  # 0.9: never arrives: lost
        timeline.rig("RESET", "OK RESET")  # 1.0
    from hil_tests.timeline import read_timeline

    return read_timeline(path)


def test_series_follow_the_records(tmp_path: Path) -> None:
    records = _records(tmp_path / "scenario.jsonl")
    assert rate_steps(records) == [(100.0, 9600), (1000.0, 0)]
    assert latencies(records, 0) == [(200.0, 0.3)]
    depths = queue_depths(records)
    assert [d for _, d in depths[1]] == [1, 2, 1, 0, 1]  # the expired one leaves the queue; the lost one stays
    assert [d for _, d in depths[0]] == [1, 0]
    assert measured_goodput(records, window_ms=1000) == [(1000.0, 2400.0)]  # 300 bytes in the first second


def test_bounds_pass_and_fail_on_what_was_measured(tmp_path: Path) -> None:
    records = _records(tmp_path / "scenario.jsonl")
    tight = {"test_alerts_overtake_a_growing_backlog_that_drains_in_priority_order": [LatencyBound("alerts", 0, 0.2)]}
    loose = {"test_alerts_overtake_a_growing_backlog_that_drains_in_priority_order": [LatencyBound("alerts", 0, 3)]}
    lost, alerts = check_bounds(SCENARIO, records, tight)
    assert (lost.measured, lost.passed) == ("1", False)
    assert (alerts.measured, alerts.passed) == ("0.30 s", False)
    assert check_bounds(SCENARIO, records, loose)[1].passed


def test_the_run_report_writes_a_png_per_scenario_and_a_summary(tmp_path: Path) -> None:
    _records(tmp_path / "scenario.jsonl")
    summary = write_run_report(tmp_path, {SCENARIO: "failed"})
    png = (tmp_path / "scenario.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    text = summary.read_text()
    assert f"| {SCENARIO} | failed | nothing lost (sent, never received, not expired) | 1 | 0 | FAIL |" in text
    assert "| alert latency while the link is slow | 0.30 s | 3 s | pass |" in text
