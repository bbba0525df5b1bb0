"""A bench's history: every HIL run's measured figures in one SQLite database, and a trend plot per figure.

A lab runs the scenarios every day, on several gateways and rig boxes. Each run's folder holds its own
timelines, ``summary.md`` and plots, and nothing compares runs, so a drift (alert latency creeping from
1.5 s towards its 3 s bound over a fortnight) shows only on the day it fails. Here every run is recorded in
one database, ``history.db`` beside the run folders unless the bench file names another
(``[history] database``), with sqlite-utils (https://sqlite-utils.datasette.io/): its upserts make
recording a run twice harmless, and ``sqlite-utils query history.db "..."`` or Datasette is how a lab looks
at it. Two tables:

* ``runs``: ``run_id`` (primary key), ``started`` (UTC, ISO 8601), ``bench``, ``rig``,
  ``gateway_version``, ``firmware_version``.
* ``measurements``: one row per (``run_id``, ``scenario``, ``figure``): ``value`` (None when the run
  measured nothing), ``bound``, ``bound_kind`` (``max``: the value must not exceed it), ``unit``,
  ``passed`` (0/1), ``outcome`` (the scenario's pytest outcome).

`plot_trends` draws, per scenario and figure, the value over the last N runs of each bench, with the bound
as it was enforced in each run (a step line: a bound that changed shows where), and failed runs marked.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

DEFAULT_TREND_RUNS = 20


@dataclass(frozen=True)
class RunInfo:
    """What identifies a run among a lab's runs."""

    run_id: str
    started: str  # UTC, ISO 8601: sorts as time
    bench: str
    rig: str
    gateway_version: str
    firmware_version: str


@dataclass(frozen=True)
class Measurement:
    """One figure of one scenario in one run, against its bound."""

    scenario: str
    figure: str
    value: float | None
    bound: float
    unit: str
    passed: bool
    outcome: str
    bound_kind: str = "max"


@dataclass(frozen=True)
class TrendPoint:
    run_id: str
    started: str
    bench: str
    value: float | None
    bound: float
    passed: bool


def record_run(database: Path, run: RunInfo, measurements: Iterable[Measurement]) -> None:
    """Add ``run`` and its measurements (replacing what an earlier recording of the same run said)."""
    database.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite_utils.Database(database)
    db["runs"].upsert(dataclasses.asdict(run), pk="run_id")  # type: ignore[union-attr]
    rows = [{"run_id": run.run_id, **dataclasses.asdict(m), "passed": int(m.passed)} for m in measurements]
    if rows:
        db["measurements"].upsert_all(  # type: ignore[union-attr]
            rows, pk=("run_id", "scenario", "figure"), foreign_keys=[("run_id", "runs", "run_id")],
        )
    db.close()


def trend(database: Path, scenario: str, figure: str, last: int = DEFAULT_TREND_RUNS) -> list[TrendPoint]:
    """The figure's points over the last ``last`` runs of each bench, oldest first."""
    db = sqlite_utils.Database(database)
    if "measurements" not in db.table_names():
        return []
    rows = list(db.query(
        """
        select runs.run_id, started, bench, value, bound, passed from measurements
        join runs on runs.run_id = measurements.run_id
        where scenario = :scenario and figure = :figure
        order by started desc, runs.run_id desc
        """,
        {"scenario": scenario, "figure": figure},
    ))
    db.close()
    kept: dict[str, list[TrendPoint]] = defaultdict(list)
    for row in rows:
        if len(kept[row["bench"]]) < last:
            kept[row["bench"]].append(TrendPoint(row["run_id"], row["started"], row["bench"], row["value"],
                                                 row["bound"], bool(row["passed"])))
    return sorted((point for points in kept.values() for point in points), key=lambda p: (p.started, p.run_id))


def figures(database: Path) -> list[tuple[str, str, str]]:
    """Every (scenario, figure, unit) the database holds."""
    db = sqlite_utils.Database(database)
    if "measurements" not in db.table_names():
        return []
    found = [(row["scenario"], row["figure"], row["unit"]) for row in
             db.query("select scenario, figure, max(unit) as unit from measurements group by scenario, figure "
                      "order by scenario, figure")]
    db.close()
    return found


def plot_trends(database: Path, folder: Path, last: int = DEFAULT_TREND_RUNS) -> list[Path]:
    """A ``trend-<scenario>-<figure>.png`` per figure in ``folder``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hil_tests.timeline import scenario_file_name

    written = []
    for scenario, figure, unit in figures(database):
        points = trend(database, scenario, figure, last)
        if not points:
            continue
        axis_figure, axis = plt.subplots(figsize=(9, 3.5))
        axis.set_title(f"{scenario}: {figure}", fontsize=9)
        by_bench: dict[str, list[tuple[int, TrendPoint]]] = defaultdict(list)
        for index, point in enumerate(points):
            by_bench[point.bench].append((index, point))
        for bench, indexed in by_bench.items():
            axis.plot([i for i, p in indexed if p.value is not None], [p.value for _, p in indexed if p.value is not None],
                      "o-", label=f"{bench}")
            failed = [(i, p.value) for i, p in indexed if not p.passed and p.value is not None]
            if failed:
                axis.plot([i for i, _ in failed], [v for _, v in failed], "x", color="red", markersize=10,
                          label=f"{bench}: failed")
        axis.step(range(len(points)), [p.bound for p in points], where="mid", color="red", linestyle="--",
                  label="bound")
        axis.set_xticks(range(len(points)), [p.run_id[:15] for p in points], rotation=60, fontsize=6)
        axis.set_ylabel(unit, fontsize=8)
        axis.legend(fontsize=7, loc="upper left")
        axis_figure.tight_layout()
        path = folder / ("trend-" + scenario_file_name(f"{scenario}-{figure}").removesuffix(".jsonl") + ".png")
        axis_figure.savefig(path, dpi=80)
        plt.close(axis_figure)
        written.append(path)
    return written
