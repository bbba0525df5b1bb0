"""Timelines: the records written per scenario, reading them back, and the summary table."""

from __future__ import annotations

import json

import pytest

from hil_tests.timeline import (
    FIELDS,
    Timeline,
    TimelineRun,
    format_summary,
    read_timeline,
    summarize,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_records_have_every_field_and_milliseconds_since_the_scenario_start(tmp_path):
    clock = FakeClock()
    path = tmp_path / "run" / "s.jsonl"
    with Timeline(path, "run-1", "outage", clock=clock) as timeline:
        clock.now += 0.25
        timeline.sent("m1", 0, "thermostat-01", topic="alerts")
        clock.now += 1.5
        timeline.rig("DOWN", "OK DOWN")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"run_id": "run-1", "scenario": "outage", "message_id": "m1", "priority": 0, "device": "thermostat-01",
         "event": "sent", "t_ms": 250.0, "detail": {"topic": "alerts"}},
        {"run_id": "run-1", "scenario": "outage", "message_id": None, "priority": None, "device": None,
         "event": "rig", "t_ms": 1750.0, "detail": {"command": "DOWN", "reply": "OK DOWN"}},
    ]  # fmt: skip
    assert read_timeline(path) == lines


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.record("lost", message_id="m"), "event must be one of"),
        (lambda t: t.record("sent"), "needs a message_id"),
        (lambda t: t.sent("m", 10, "d"), "priority must be 0..9"),
        (lambda t: t.sent("m", True, "d"), "priority must be 0..9"),
        (lambda t: t.sent("m", 1, "d", payload=object()), "not JSON serializable"),
    ],
)
def test_bad_records_are_refused_and_nothing_is_written(tmp_path, call, message):
    with Timeline(tmp_path / "s.jsonl", "r", "s") as timeline, pytest.raises((ValueError, TypeError), match=message):
        call(timeline)
    assert (tmp_path / "s.jsonl").read_text() == ""


def test_a_run_keeps_one_file_per_scenario_under_its_run_id(tmp_path):
    run = TimelineRun(tmp_path, run_id="20260101T000000Z-abcd")
    with run.timeline("test_outage[netns]") as timeline:
        timeline.sent("m1", 1, "d1")
    with run.timeline("test_rate") as timeline:
        timeline.rig("RATE 9600", "OK RATE 9600")
    assert sorted(p.name for p in run.folder.iterdir()) == ["test_outage_netns.jsonl", "test_rate.jsonl"]
    assert {r["scenario"] for r in run.records()} == {"test_outage[netns]", "test_rate"}


def test_reading_rejects_lines_that_are_not_timeline_records(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"run_id": "r"}\n')
    with pytest.raises(ValueError, match=f"bad.jsonl:1: expected the keys {', '.join(FIELDS)}"):
        read_timeline(path)


def _record(event, message_id=None, priority=None, t_ms=0.0, scenario="s"):
    return {"run_id": "r", "scenario": scenario, "message_id": message_id, "priority": priority, "device": "d",
            "event": event, "t_ms": t_ms, "detail": {}}  # fmt: skip


def test_summary_counts_lost_expired_duplicates_and_latency_per_priority():
    records = [
        _record("rig"),
        *(_record("sent", f"a{i}", 0, t_ms=i * 10.0) for i in range(4)),
        *(_record("received", f"a{i}", 0, t_ms=i * 10.0 + 100 + i) for i in range(4)),
        _record("received", "a0", 0, t_ms=500.0),  # duplicate of a0
        _record("sent", "b1", 1), _record("sent", "b2", 1), _record("sent", "b3", 1),
        _record("expired", "b1", 1), _record("received", "b2", 1, t_ms=2000.0),
    ]  # fmt: skip
    alerts, data = summarize(records)
    assert (alerts.priority, alerts.sent, alerts.received, alerts.lost, alerts.duplicates) == (0, 4, 4, 0, 1)
    assert (alerts.p50_ms, alerts.p95_ms, alerts.max_ms) == (101.5, 103.0, 103.0)
    assert (data.sent, data.received, data.expired, data.lost, data.max_ms) == (3, 1, 1, 1, 2000.0)
    assert alerts.rig_commands == data.rig_commands == 1


def test_summary_table_has_a_header_and_one_line_per_row():
    table = format_summary(summarize([_record("sent", "a", 0), _record("rig", scenario="only-rig")]))
    lines = table.splitlines()
    assert lines[0].split() == ["scenario", "prio", "sent", "recv", "expired", "lost", "dup", "p50", "ms", "p95",
                                "ms", "max", "ms", "rig"]  # fmt: skip
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["only-rig", "-", "0", "0", "0", "0", "0", "-", "-", "-", "1"]
    assert lines[3].split() == ["s", "0", "1", "0", "0", "1", "0", "-", "-", "-", "0"]
