"""Structured Streaming: the same result as batch on the same input, incrementally; late rows dropped.

Each thermostat, gateway and gateway queue closes its windows on its own times, moved by the rows the
stream can no longer be missing (received at least --lateness before the newest, ``ordered.py``), so the
runs below end with a flush of every key of the sample a day later, and a tick of the flush gateway after
it that brings the receive horizon past the flush; they compare the sample's day."""

import pytest

from pipeline.jobs.settings import JobSettings
from tests.pipeline.pipeline_data import FLUSH_GATEWAY, SAMPLE_LATENESS, metrics, reading, write_batch, write_sample

pytestmark = pytest.mark.slow  # Spark jobs over the sample: seconds each


def run_stream(spark, landing, out, checkpoint, lateness=SAMPLE_LATENESS):
    from pipeline.jobs import stream
    from pipeline.jobs.source import StreamOptions

    settings = JobSettings(str(landing), str(out), lateness=lateness)
    # One landing file per micro-batch, so the watermark moves between files as it would live.
    stream.run_stream(spark, settings, str(checkpoint), StreamOptions(max_files_per_trigger=1), once=True,
                      progress=lambda _: None)
    return settings


def tick(minute):
    """A reading and a metrics message of the flush gateway (left out of every comparison) at ``minute``:
    later receive times, so the receive horizon passes what came before."""
    return [reading(FLUSH_GATEWAY, "tf", 7000 + minute, minute, 20.0, 20.0, False),
            metrics(FLUSH_GATEWAY, minute, {0: {"sent": 0}})]


def flush_every_key(landing, index):
    """A reading of each thermostat and a metrics message of gw1 a day later, and a tick after it: every
    window of the sample is then closed by its own key's progress."""
    write_batch(landing, [reading("gw1", "t1", 5000, 24 * 60, 20.0, 22.0, False),
                          reading("gw1", "t2", 5001, 24 * 60, 18.0, 19.0, True, priority=2),
                          metrics("gw1", 24 * 60, {5: {"sent": 0}, 2: {"sent": 0}}), *tick(24 * 60 + 10)], index)


def sample_day(frame):
    """``frame``'s rows of the sample's day, the flush gateway's left out, ``date`` as text."""
    from pyspark.sql import functions as F

    if "gateway_id" in frame.columns:  # the flush rows are in open windows in streaming
        frame = frame.where(~F.col("gateway_id").eqNullSafe(FLUSH_GATEWAY))
    if "date" in frame.columns:  # a date when read back from the partition folders
        frame = frame.withColumn("date", F.col("date").cast("string")).where(F.col("date") == "2026-01-01")
    return frame


def comparable(frame):
    table = sample_day(frame).toPandas()
    return table.sort_values(list(table.columns)).reset_index(drop=True)


def test_streaming_in_two_runs_gives_the_batch_result(spark, tmp_path):
    from pyspark.testing import assertDataFrameEqual

    from pipeline.jobs import batch

    landing = tmp_path / "landing"
    write_sample(landing, range(0, 2))
    run_stream(spark, landing, tmp_path / "out", tmp_path / "checkpoint")
    first_run = spark.read.parquet(str(tmp_path / "out" / "rollups")).count()
    assert 0 < first_run < 8  # windows the watermark has passed, not the open ones

    write_sample(landing, range(2, 4))  # later data; the second run resumes from the checkpoint
    flush_every_key(landing, 4)
    settings = run_stream(spark, landing, tmp_path / "out", tmp_path / "checkpoint")

    batched = batch.build(spark, settings)
    streamed_outputs = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert streamed_outputs == ["delivery_latency", "quarantine", "queue_counters", "rollups", "setpoint_changes"]
    for name in streamed_outputs:
        streamed = sample_day(spark.read.parquet(settings.output(name)))
        assert streamed.count() > 0, name
        # the whole frame, column types included: both are written by the output's one schema
        assertDataFrameEqual(streamed, sample_day(batched[name]).select(*streamed.columns))


def test_late_rows_are_dropped_by_streaming_and_counted_by_batch(spark, tmp_path):
    from pipeline.jobs import batch

    landing = tmp_path / "landing"
    write_batch(landing, [reading("gw1", "t1", m, m, 20.0, 20.0, True) for m in range(10)], 0)
    write_batch(landing, [reading("gw1", "t1", 12, 12, 20.0, 20.0, True)], 1)
    # A row is late when its window was closed by the thermostat's progress before it came (here 00:10
    # - 2 minutes of lateness after the second file):
    write_batch(landing, [
        reading("gw1", "t1", 100, 1, 25.0, 25.0, True),  # six minutes behind it: late
        reading("gw1", "t1", 101, 11, 20.0, 20.0, True),  # out of order, but its window is still open
    ], 2)
    write_batch(landing, [reading("gw1", "t1", 102, 60, 20.0, 20.0, True), *tick(70)], 3)  # closes 00:10 for t1
    settings = run_stream(spark, landing, tmp_path / "out", tmp_path / "checkpoint")

    def readings_per_window(frame):
        rows = comparable(frame.select("window_start", "readings", "gateway_id"))
        return dict(zip(rows["window_start"].dt.strftime("%H:%M"), rows["readings"], strict=True))

    def set_points(frame):
        return comparable(frame.select("changed_ms", "set_point", "gateway_id"))["set_point"].tolist()

    batch_outputs = batch.build(spark, settings)
    assert readings_per_window(spark.read.parquet(settings.output("rollups"))) == {"00:00": 5, "00:05": 5, "00:10": 2}
    assert readings_per_window(batch_outputs["rollups"]) == {"00:00": 6, "00:05": 5, "00:10": 2, "01:00": 1}
    assert set_points(spark.read.parquet(settings.output("setpoint_changes"))) == [20.0]
    assert set_points(batch_outputs["setpoint_changes"]) == [20.0, 25.0, 20.0]
