"""A batch run's outputs change together or not at all, and a corrupt bronze file is rebuilt from its
landing files (``python -m pipeline rebuild-bronze``)."""

import json

import pytest

from pipeline.jobs.settings import JobSettings
from tests.pipeline.pipeline_data import metrics, reading, write_batch
from tests.pipeline.test_batch_range import fingerprint

pytestmark = pytest.mark.slow  # three batch runs


def outputs_of(out):
    return {folder.name: fingerprint(folder) for folder in sorted(out.iterdir()) if not folder.name.startswith("_")}


def test_a_run_that_fails_changes_no_output_and_a_rebuilt_bronze_table_lets_it_run(spark, tmp_path):
    from pipeline.jobs.batch import run_batch

    landing, out = tmp_path / "landing", tmp_path / "out"
    write_batch(landing, [reading("gw1", "t1", n, n, 20.0, 21.0, False) for n in range(10)]
                + [metrics("gw1", n, {5: {"sent": n, "depth": 0, "oldest_age_s": 0}}) for n in range(10)], 0)
    settings = JobSettings(str(landing), str(out))
    run_batch(spark, settings, progress=lambda _: None)
    before = outputs_of(out)

    write_batch(landing, [reading("gw1", "t1", 100 + n, 20 + n, 22.0, 21.0, True) for n in range(5)], 1)
    (victim,) = [path for path in (landing / "_bronze" / "metrics").glob("date=*/*.parquet")][:1]
    victim.write_bytes(b"PAR1 this is not parquet any more PAR1")
    with pytest.raises(Exception):  # noqa: B017 - Spark's error for an unreadable Parquet file
        run_batch(spark, settings, progress=lambda _: None)
    assert outputs_of(out) == before  # before: rollups, set points and latency of the new run, counters of the old
    assert not [path for path in out.iterdir() if path.name.startswith("_staging")]

    from pipeline.jobs.bronze import rebuild  # what `python -m pipeline rebuild-bronze --kind metrics` runs

    aside, done = rebuild(spark, str(landing), str(landing / "_bronze"), "metrics")
    assert done.input_rows == 10 and aside.endswith(tuple("0123456789"))
    counts = run_batch(spark, settings, progress=lambda _: None)
    assert counts["queue_counters"] > 0 and counts["rollups"] > 0
    rollups = spark.read.parquet(settings.output("rollups")).groupBy().sum("readings").first()[0]
    assert rollups == 15


def test_a_rebuild_is_refused_when_landing_files_are_gone(spark, tmp_path):
    from pipeline.jobs.bronze import RebuildRefused, compact, rebuild

    landing = tmp_path / "landing"
    write_batch(landing, [metrics("gw1", n, {5: {"sent": n}}) for n in range(3)], 0)
    compact(spark, str(landing), str(landing / "_bronze"))
    for path in (landing / "metrics").rglob("*.jsonl"):
        path.unlink()  # archived after compaction
    with pytest.raises(RebuildRefused, match="1 of the 1 landing files the metrics table was made of are gone"):
        rebuild(spark, str(landing), str(landing / "_bronze"), "metrics")


def test_an_interrupted_commit_is_completed_by_the_next_run(spark, tmp_path):
    from pipeline.jobs.output import JOURNAL, PARTITIONS, WHOLE, commit_outputs, finish_commit, write_output

    out = tmp_path / "out"
    frame = spark.createDataFrame([("a", "2026-01-01"), ("b", "2026-01-02")], "v string, date string")
    write_output(spark, frame, str(out / "one"))
    write_output(spark, frame.where("v = 'a'").drop("date"), str(out / "two"))
    staging = str(out / "_staging-1")
    write_output(spark, frame.where("v = 'b'").selectExpr("'c' AS v", "date"), f"{staging}/one")
    write_output(spark, frame.where("v = 'b'").drop("date"), f"{staging}/two")
    (out / JOURNAL).write_text(json.dumps({"staging": staging, "outputs": {"one": PARTITIONS, "two": WHOLE}}))
    assert finish_commit(spark, str(out))  # what a run that died among the renames leaves, completed
    one = sorted((r.v, str(r.date)) for r in spark.read.parquet(str(out / "one")).collect())
    assert one == [("a", "2026-01-01"), ("c", "2026-01-02")]  # 01-02 replaced, 01-01 kept
    assert [r.v for r in spark.read.parquet(str(out / "two")).collect()] == ["b"]
    assert not (out / JOURNAL).exists() and not (out / "_staging-1").exists()
    commit_outputs(spark, str(out), staging, {})  # nothing staged: a no-op
