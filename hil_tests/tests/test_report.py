"""The run report: series computed from timeline records, bounds judged, plots and summary.md written."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from hil_tests.report import (
    LatencyBound,
    check_bounds,
    latencies,
    measured_goodput,
    queue_depths,
    rate_steps,
    write_run_report,
)
from hil_tests.timeline import Timeline, read_timeline, summarize

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


def test_a_reception_recorded_before_its_sending_leaves_no_backlog_in_the_plot(tmp_path: Path) -> None:
    """Issue 26 section 8: the tap (gateway) and the collector (cloud) record on their own threads, and 4 of
    40 set-point scenario messages had ``received`` 0.5-1.9 ms before ``sent``. The plot ended at a backlog
    of 4 while the summary said 40 of 40 received; the latency was negative."""
    ticks = iter([0.0, 0.010, 0.0105, 0.020, 0.030])
    with Timeline(tmp_path / "s.jsonl", "run-1", "test_x", clock=lambda: next(ticks)) as timeline:
        timeline.received("d/data/1@1", 1, "t1", bytes=10)  # 10 ms
        timeline.sent("d/data/1@1", 1, "t1")  # 10.5 ms: the tap's thread came second
        timeline.sent("d/data/2@1", 1, "t1")  # 20 ms
        timeline.received("d/data/2@1", 1, "t1", bytes=10)  # 30 ms
    records = read_timeline(tmp_path / "s.jsonl")
    assert queue_depths(records)[1][-1][1] == 0
    assert all(depth >= 0 for _, depth in queue_depths(records)[1])
    assert latencies(records, 1) == [(10.5, 0.0), (20.0, 0.01)]
    (row,) = summarize(records)
    assert (row.received, row.lost, row.p50_ms) == (2, 0, 5.0)  # the median of 0 and 10 ms


EVENT_ORDERS = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from(["sent", "received", "expired"]), st.integers(0, 2), st.floats(0, 50)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(events=EVENT_ORDERS)
def test_the_plotted_backlog_ends_where_the_summary_says_and_never_goes_below_zero(events) -> None:
    """Any records, in any order, with any skew between the observers: the queue-depth series ends, per
    priority, at the number of messages the summary counts as neither received nor expired."""
    records, now = [], 0.0
    priority_of = {}
    for number, event, priority, gap in events:
        now += gap
        message = f"m{number}"
        priority_of.setdefault(message, priority)  # a message keeps its priority, as in a real run
        records.append({"run_id": "r", "scenario": "s", "message_id": message, "priority": priority_of[message],
                        "device": "d", "event": event, "t_ms": now, "detail": {}})
    depths = queue_depths(records)
    for row in summarize(records):
        series = depths.get(row.priority, [(0.0, 0)])
        assert series[-1][1] == row.lost
        assert all(depth >= 0 for _, depth in series)
        assert [t for t, _ in series] == sorted({t for t, _ in series})
