"""Batch over receive dates: dynamic partition overwrite of the days a run can touch, nothing else."""

import hashlib
import shutil
from pathlib import Path

import pytest

from pipeline.cli import build_parser
from pipeline.envelope import Incoming
from pipeline.jobs.settings import JobSettings
from tests.pipeline import duckdb_reference
from tests.pipeline.pipeline_data import MINUTE, T0, metrics, reading, write_batch

DAY = 24 * 60  # minutes
HOUR = 60


def _queue(sent):
    return {"depth": 1, "oldest_age_s": 0.5, "sent": sent, "expired": 0, "dropped": 0, "retries": 0}


def five_days(every_hours: int = 1) -> list[Incoming]:
    """gw1/t1 and gw2/t2 reading every ``every_hours`` hours for five days (2026-01-01..05); set points
    change now and then; gw1 sends metrics as often and restarts on day 3. (The ingest seals a file per
    hour and kind: every hour is 240 landing files.)"""
    out = []
    for hour in range(0, 5 * 24, every_hours):
        minute = hour * HOUR
        out.append(reading("gw1", "t1", hour + 1, minute + 7, 20 + hour % 5, 20.0 + (hour // 17) % 3, hour % 2 == 0))
        out.append(reading("gw2", "t2", hour + 1, minute + 31, 18 + hour % 3, 19.0 + (hour // 29) % 2, True,
                           latency_ms=20 * MINUTE))  # received 20 minutes later: some cross midnight
        out.append(metrics("gw1", minute + 1, {5: _queue(hour * 3 if hour < 60 else (hour - 60) * 2)}))
    return out


def late_arrivals() -> list[Incoming]:
    """Received on 2026-01-04: gw2's backlog of 2026-01-03 (readings it had not sent), a copy of one of
    its readings already landed, and a malformed message."""
    day4 = T0 + 3 * DAY * MINUTE
    backlog = [reading("gw2", "t2", 1000 + n, 2 * DAY + n * 40 + 3, 25.0, 19.5, False, received_ms=day4 + n * 1000)
               for n in range(30)]
    copy = reading("gw2", "t2", 50, 49 * HOUR + 31, 18 + 49 % 3, 19.0 + (49 // 29) % 2, True, received_ms=day4 + HOUR)
    bad = reading("gw2", "t2", 2000, 3 * DAY + 10, 0, 0, False, payload=b"{nope", received_ms=day4 + 2 * HOUR)
    return [*backlog, copy, bad]


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def table(spark, path):
    frame = spark.read.parquet(path).toPandas()
    for column in frame.columns:
        if frame[column].dtype == object and frame[column].map(lambda v: isinstance(v, (list, dict))).any():
            frame[column] = frame[column].map(str)
    return duckdb_reference.comparable(frame)


@pytest.mark.slow  # three batch runs over five days: over a minute on the 2-core machine
def test_a_rerun_of_one_day_rewrites_only_what_it_can_touch_and_equals_a_full_run(spark, tmp_path):
    from pyspark.testing import assertDataFrameEqual

    from pipeline.jobs.batch import run_batch

    landing = tmp_path / "landing"
    write_batch(landing, five_days(), 0)
    out = tmp_path / "out"
    run_batch(spark, JobSettings(str(landing), str(out)), progress=lambda _: None)
    before = {name.name: fingerprint(name) for name in out.iterdir()}

    write_batch(landing, late_arrivals(), 1)
    args = build_parser().parse_args(["batch", "--landing", str(landing), "--out", str(out), "--from", "2026-01-04"])
    from pipeline.cli import _settings

    ranged = _settings(args)
    assert ranged.output_dates() == ("2026-01-03", "2026-01-04")
    assert ranged.read_dates() == ["2026-01-02", "2026-01-03", "2026-01-04", "2026-01-05"]
    run_batch(spark, ranged, progress=lambda _: None)

    untouched = ("date=2026-01-01", "date=2026-01-02", "date=2026-01-05")
    for name, files in before.items():
        if name.startswith("firmware"):
            continue  # no firmware status in these days: empty before and after
        after = fingerprint(out / name)
        kept = {path: digest for path, digest in files.items() if path.startswith(untouched)}
        assert kept or name == "quarantine", name  # nothing was quarantined before the late arrivals
        assert {path: after.get(path) for path in kept} == kept, name  # same files, same bytes
        rewritten = ("date=2026-01-03", "date=2026-01-04")
        assert any(path.startswith(rewritten) and path not in files for path in after), name

    full = tmp_path / "full"
    run_batch(spark, JobSettings(str(landing), str(full)), progress=lambda _: None)
    for name in before:
        assertDataFrameEqual(spark.read.parquet(str(out / name)), spark.read.parquet(str(full / name)))
    con = duckdb_reference.connect(landing)
    rollups = table(spark, str(out / "rollups"))
    assert rollups["readings"].sum() == duckdb_reference.rollups(con)["readings"].sum() == 5 * 24 * 2 + 30


def test_a_range_reads_only_its_days(spark, tmp_path):
    from pipeline.jobs.batch import run_batch

    landing = tmp_path / "landing"
    write_batch(landing, five_days(every_hours=6), 0)  # which days are read, not how much of each: 40 files
    shutil.rmtree(landing / "events" / "date=2026-01-01")  # a run that read it would not notice; so break it
    (landing / "events" / "date=2026-01-01" / "hour=00").mkdir(parents=True)
    (landing / "events" / "date=2026-01-01" / "hour=00" / "part-x.jsonl").write_text("not json\n")
    # A reading about 01-04 landed on 01-01 (its receive date): a run that read 01-01 would roll it up into
    # a day it writes. (The unreadable line's reject would be of 01-01, a day the run does not write.)
    write_batch(landing, [reading("gw9", "t9", 1, 3 * DAY + 10, 21.0, 21.0, True, received_ms=T0 + HOUR * MINUTE)], 1)
    settings = JobSettings(str(landing), str(tmp_path / "out"), received_from="2026-01-04", received_to="2026-01-05")
    counts = run_batch(spark, settings, progress=lambda _: None)
    assert counts["quarantine"] == 0  # the unreadable line of 01-01 was never read
    dates = sorted(path.name for path in (tmp_path / "out" / "rollups").glob("date=*"))
    assert dates == ["date=2026-01-03", "date=2026-01-04", "date=2026-01-05"]
    assert spark.read.parquet(settings.output("rollups")).where("gateway_id = 'gw9'").count() == 0
