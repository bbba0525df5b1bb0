"""Per-thermostat rollups over tumbling event-time windows (default 5 minutes) of the device's readings.

Windows are ``[start, end)`` on the reading time ``ts_ms`` and aligned to the Unix epoch, so a reading at
12:04:59.999 is in 12:00-12:05 and one at 12:05:00.000 in 12:05-12:10. ``heater_duty_cycle`` is the share
of readings with the heater on: thermostats report at a fixed period, so that is the share of time.
``set_point_last`` is the set point of the latest reading in the window (readings of one reading time: the
last by message id, the change log's order).

Batch aggregates in Spark SQL; streaming runs ``rollup_step`` as an ``OrderedFold`` keyed by thermostat,
so each thermostat's windows close on its own reading times (``ordered.py``).
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.jobs.ordered import OrderedFold, StreamTiming
from pipeline.jobs.schemas import ROLLUPS_OUTPUT
from pipeline.jobs.windows import parse_duration_ms, window_columns, window_start_ms


def rollups(readings: DataFrame, window: str) -> DataFrame:
    """``readings`` as from ``telemetry.readings``, deduplicated (batch; streaming: ``rollups_stream``).

    The window is a long key computed from ``reading_ms`` (``window_start_ms``), its timestamps and date
    built once per window after the aggregate: ``F.window`` grouped by a struct of two timestamps, which it
    computed per reading (``windows.py``).

    The readings reach the aggregate in the order the table was read (only the few ids with copies cross
    the deduplication's shuffle), so a thermostat's readings of a window are mostly in one partition and
    the partial aggregate before the shuffle shrinks them there. Repartitioning by thermostat first, which
    paid while every event came out of a shuffle by message id, now costs a shuffle more: 3M records,
    11.6-14.3 CPU-s without it against 12.9-18.7 with it (bench/RESULTS-pipeline.md)."""
    window_ms = parse_duration_ms(window)
    return written(
        readings.groupBy(window_start_ms("reading_ms", window_ms).alias("window_start_ms"), "gateway_id", "device_id")
        .agg(
            F.count(F.lit(1)).alias("readings"),
            F.min("temperature").alias("temperature_min"),
            F.avg("temperature").alias("temperature_avg"),
            F.max("temperature").alias("temperature_max"),
            F.avg("set_point").alias("set_point_avg"),
            # the latest reading in the change log's order: readings stamped alike (a clock stepped back a
            # whole number of periods) by message id; by reading time alone the file order chose
            F.max_by("set_point", F.struct("reading_ms", "message_id")).alias("set_point_last"),
            F.avg(F.col("heater").cast("double")).alias("heater_duty_cycle"),
        ),
        window_ms,
    )


def written(computed: DataFrame, window_ms: int) -> DataFrame:
    """The ``ROLLUPS_OUTPUT`` columns (batch's aggregate, streaming's fold) as the output writes them."""
    start, end, date = window_columns("window_start_ms", window_ms)
    return ROLLUPS_OUTPUT.select(computed, {"window_start": start, "window_end": end, "date": date})


def rollup_step(window_ms: int):
    """``rollups``' aggregates over one thermostat's readings, window by window (streaming)."""

    def step(key: tuple, last: dict | None, rows: pd.DataFrame) -> tuple[pd.DataFrame, dict | None]:
        rows = rows.assign(window_start_ms=rows["reading_ms"] - rows["reading_ms"] % window_ms,
                           heater=rows["heater"].astype("float64"))
        grouped = rows.groupby("window_start_ms", sort=True)
        out = pd.DataFrame({
            "readings": grouped.size(),
            "temperature_min": grouped["temperature"].min(),
            "temperature_avg": grouped["temperature"].mean(),
            "temperature_max": grouped["temperature"].max(),
            "set_point_avg": grouped["set_point"].mean(),
            "set_point_last": grouped["set_point"].last(),  # rows are in reading time order
            "heater_duty_cycle": grouped["heater"].mean(),
        }).reset_index()
        out["gateway_id"], out["device_id"] = key
        return out[ROLLUPS_OUTPUT.names], None

    return step


def rollups_stream(readings: DataFrame, window: str, timing: StreamTiming | int) -> DataFrame:
    """``rollups`` in streaming: each thermostat's windows closed by its own reading times."""
    window_ms = parse_duration_ms(window)
    fold = OrderedFold(
        keys=("gateway_id", "device_id"), time_ms="reading_ms",
        columns=("reading_ms", "message_id", "temperature", "set_point", "heater"), output=ROLLUPS_OUTPUT.ddl,
        step=rollup_step(window_ms), ready_at=lambda times: times - times % window_ms + window_ms, dedup=True,
    )
    return written(fold.stream(readings, timing), window_ms)
