"""Streaming with several ingest writers and files sealed late: a key's progress is moved only by rows the
stream can no longer be missing (the receive horizon, ``ordered.py``), so a backlog split over writers
whose files are sealed at different times keeps every reading; and a silent thermostat's last windows
are written after ``--idle-timeout`` of the fleet's receive time. Streaming rows always equal batch's."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from pipeline.envelope import land
from pipeline.jobs.settings import JobSettings
from pipeline.landing import INPROGRESS_SUFFIX, LandingWriter, partition_of
from tests.pipeline.pipeline_data import MINUTE, T0, at, reading
from tests.pipeline.test_stream_gateways import comparable

if TYPE_CHECKING:  # imported where used: every `make test` worker collects this folder and runs no Spark
    import pandas as pd

HOUR_MS = 60 * MINUTE
DRAIN_MS = T0 + 2 * HOUR_MS  # 02:00: minutes 60-119 come in a burst


def thermostat(minutes, *, drained=False, gateway="gw1", device="t1", seq0=0):
    """A reading a minute; ``drained``: received in a burst at 02:00 (100 ms apart), else 1 s after."""
    return [reading(gateway, device, seq0 + minute + 1, minute, 20.0 + minute % 7 / 2, 21.0 if minute < 100 else 22.0,
                    minute % 2 == 0, received_ms=DRAIN_MS + (minute - 60) * 100 if drained else None)
            for minute in minutes]


def land_sealed(landing, writer, messages):
    out = LandingWriter(landing, writer)
    for message in messages:
        landed = land(message)
        out.append(landed.kind, landed.record)
    out.close()


def land_open(landing, writer, messages):
    """What a writer that crashed (or is still writing) leaves: an in-progress file, named with the ingest's
    clock at its opening, as ``LandingWriter`` names it."""
    first = min(message.received_ms for message in messages)
    date, hour = partition_of(first)
    folder = landing / "events" / f"date={date}" / f"hour={hour}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".part-{writer}-{first}-000001{INPROGRESS_SUFFIX}"
    path.write_text("".join(json.dumps(land(message).record) + "\n" for message in messages))
    return path


def run(spark, settings, checkpoint):
    from pipeline.jobs import stream

    stream.run_stream(spark, settings, str(checkpoint), once=True, progress=lambda _: None)


def streamed_equal_batch(spark, settings, name="rollups") -> pd.DataFrame:
    """Every row streaming wrote is batch's row for that window; returns the streamed rows."""
    import pandas as pd

    from pipeline.jobs import batch

    streamed = comparable(spark.read.parquet(settings.output(name)).toPandas())
    whole = comparable(batch.build(spark, settings)[name].toPandas())
    keys = ["gateway_id", "device_id", "window_start"] if name == "rollups" else list(streamed.columns)
    merged = streamed.merge(whole, on=keys, how="left", suffixes=("", "_batch"), indicator=True)
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"]
    for column in streamed.columns:
        if column not in keys:
            pd.testing.assert_series_equal(merged[column], merged[f"{column}_batch"], check_names=False, obj=column)
    return streamed


def hour_two(rollups: pd.DataFrame) -> int:
    start = rollups["window_start"]
    return int(rollups[(start >= T0 + HOUR_MS) & (start < DRAIN_MS)]["readings"].sum())


@pytest.mark.slow  # three streaming runs
def test_a_backlog_split_over_two_writers_keeps_every_reading(spark, tmp_path):
    """The issue's minimal case: minutes 60-119 drained at 02:00 alternately into writer a's and b's files;
    land a, stream, land b, stream (b sealed within --lateness of a). Before: 30 of 60."""
    landing, checkpoint = tmp_path / "landing", tmp_path / "checkpoint"
    settings = JobSettings(str(landing), str(tmp_path / "out"))
    drained = thermostat(range(60, 120), drained=True)
    land_sealed(landing, "ingest-a", thermostat(range(0, 60)) + drained[0::2])
    run(spark, settings, checkpoint)
    land_sealed(landing, "ingest-b", drained[1::2])
    run(spark, settings, checkpoint)
    land_sealed(landing, "ingest-a2", thermostat(range(120, 180)))
    run(spark, settings, checkpoint)
    rollups = streamed_equal_batch(spark, settings)
    assert hour_two(rollups) == 60
    assert rollups["window_start"].max() == at(150)  # closed by rows received by 02:59 - lateness
    streamed_equal_batch(spark, settings, "setpoint_changes")


@pytest.mark.slow  # three streaming runs
def test_a_file_sealed_an_hour_late_after_a_crash_keeps_every_reading(spark, tmp_path):
    """Writer b crashes at 02:00 with its half of the drain in an open file; writer a goes on for an hour,
    and the stream runs meanwhile; b comes back (its recovery seals the file) and the stream runs again."""
    landing, checkpoint = tmp_path / "landing", tmp_path / "checkpoint"
    settings = JobSettings(str(landing), str(tmp_path / "out"))
    drained = thermostat(range(60, 120), drained=True)
    land_open(landing, "ingest-b", drained[1::2])
    land_sealed(landing, "ingest-a", thermostat(range(0, 60)) + drained[0::2] + thermostat(range(120, 180)))
    run(spark, settings, checkpoint)
    early = comparable(spark.read.parquet(settings.output("rollups")).toPandas())
    assert early.empty or early["window_start"].max() < T0 + HOUR_MS  # nothing after b's open file closed
    assert LandingWriter(landing, "ingest-b").recovered  # the restart seals it
    run(spark, settings, checkpoint)
    rollups = streamed_equal_batch(spark, settings)
    assert hour_two(rollups) == 60


@pytest.mark.slow  # two streaming runs
def test_a_silent_thermostat_gets_its_last_windows_after_the_idle_timeout(spark, tmp_path):
    """t1 dies at 00:42; t2 goes on. Its windows up to 00:45 are written once the fleet's receive time is
    --idle-timeout past its last message, equal to batch's; before, never."""
    landing, checkpoint = tmp_path / "landing", tmp_path / "checkpoint"
    settings = JobSettings(str(landing), str(tmp_path / "out"), idle_timeout="20 minutes")
    land_sealed(landing, "ingest-a", thermostat(range(0, 43)) + thermostat(range(0, 50), device="t2", seq0=1000))
    run(spark, settings, checkpoint)
    assert comparable(spark.read.parquet(settings.output("rollups")).toPandas()).query("device_id == 't1'")[
        "window_start"].max() < at(40)  # t2 has not gone far enough yet
    land_sealed(landing, "ingest-b", thermostat(range(50, 120), device="t2", seq0=1000))
    run(spark, settings, checkpoint)
    rollups = streamed_equal_batch(spark, settings)
    silent = rollups[rollups["device_id"] == "t1"]
    assert silent["readings"].sum() == 43 and silent["window_start"].max() == at(40)
    streamed_equal_batch(spark, settings, "setpoint_changes")
