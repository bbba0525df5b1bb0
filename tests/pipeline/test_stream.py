"""Structured Streaming: the same result as batch on the same input, incrementally; late rows dropped."""

import pandas as pd
import pytest
from pyspark.sql import functions as F

from pipeline.jobs import batch, stream
from pipeline.jobs.settings import JobSettings
from pipeline.jobs.source import StreamOptions
from tests.pipeline.pipeline_data import (
    FLUSH_GATEWAY,
    SAMPLE_LATENESS,
    reading,
    write_batch,
    write_sample,
)

pytestmark = pytest.mark.slow  # Spark jobs over the sample: seconds each


def run_stream(spark, landing, out, checkpoint, lateness=SAMPLE_LATENESS):
    settings = JobSettings(str(landing), str(out), lateness=lateness)
    # One landing file per micro-batch, so the watermark moves between files as it would live.
    stream.run_stream(spark, settings, str(checkpoint), StreamOptions(max_files_per_trigger=1), once=True,
                      progress=lambda _: None)
    return settings


def comparable(frame):
    if "gateway_id" in frame.columns:  # the flush rows exist in batch only (streaming keeps them open)
        frame = frame.where(~F.col("gateway_id").eqNullSafe(FLUSH_GATEWAY))
    table = frame.toPandas()
    return table.sort_values(list(table.columns)).reset_index(drop=True)


def test_streaming_in_two_runs_gives_the_batch_result(spark, tmp_path, batch_outputs):
    landing = tmp_path / "landing"
    write_sample(landing, range(0, 2))
    run_stream(spark, landing, tmp_path / "out", tmp_path / "checkpoint")
    first_run = spark.read.parquet(str(tmp_path / "out" / "rollups")).count()
    assert 0 < first_run < 8  # windows the watermark has passed, not the open ones

    write_sample(landing, range(2, 4))  # later data; the second run resumes from the checkpoint
    settings = run_stream(spark, landing, tmp_path / "out", tmp_path / "checkpoint")

    batch_settings, _ = batch_outputs
    streamed_outputs = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert streamed_outputs == ["delivery_latency", "quarantine", "queue_counters", "rollups", "setpoint_changes"]
    for name in streamed_outputs:
        streamed = comparable(spark.read.parquet(settings.output(name)))
        batched = comparable(spark.read.parquet(batch_settings.output(name)))
        assert len(streamed) > 0, name
        pd.testing.assert_frame_equal(streamed, batched, check_dtype=False, obj=name)


def test_late_rows_are_dropped_by_streaming_and_counted_by_batch(spark, tmp_path):
    landing = tmp_path / "landing"
    write_batch(landing, [reading("gw1", "t1", m, m, 20.0, 20.0, True) for m in range(10)], 0)
    write_batch(landing, [reading("gw1", "t1", 12, 12, 20.0, 20.0, True)], 1)
    # Spark drops a row as late against the watermark the previous micro-batch ended with (here 00:07):
    write_batch(landing, [
        reading("gw1", "t1", 100, 1, 25.0, 25.0, True),  # six minutes behind it: late
        reading("gw1", "t1", 101, 11, 20.0, 20.0, True),  # out of order, but its window is still open
    ], 2)
    write_batch(landing, [reading(FLUSH_GATEWAY, "tf", 1, 60, 20.0, 20.0, False)], 3)
    settings = run_stream(spark, landing, tmp_path / "out", tmp_path / "checkpoint")

    def readings_per_window(frame):
        rows = comparable(frame.select("window_start", "readings", "gateway_id"))
        return dict(zip(rows["window_start"].dt.strftime("%H:%M"), rows["readings"], strict=True))

    def set_points(frame):
        return comparable(frame.select("changed_ms", "set_point", "gateway_id"))["set_point"].tolist()

    batch_outputs = batch.build(spark, settings)
    assert readings_per_window(spark.read.parquet(settings.output("rollups"))) == {"00:00": 5, "00:05": 5, "00:10": 2}
    assert readings_per_window(batch_outputs["rollups"]) == {"00:00": 6, "00:05": 5, "00:10": 2}
    assert set_points(spark.read.parquet(settings.output("setpoint_changes"))) == [20.0]
    assert set_points(batch_outputs["setpoint_changes"]) == [20.0, 25.0, 20.0]
