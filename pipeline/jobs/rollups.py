"""Per-thermostat rollups over tumbling event-time windows (default 5 minutes) of the device's readings.

Windows are ``[start, end)`` on the reading time ``ts_ms`` and aligned to the Unix epoch, so a reading at
12:04:59.999 is in 12:00-12:05 and one at 12:05:00.000 in 12:05-12:10. ``heater_duty_cycle`` is the share
of readings with the heater on: thermostats report at a fixed period, so that is the share of time.
``set_point_last`` is the set point of the latest reading in the window.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def rollups(readings: DataFrame, window: str) -> DataFrame:
    """``readings`` as from ``telemetry.readings`` (deduplicated); streaming needs a watermark on ``reading_at``."""
    return (
        readings.groupBy(F.window("reading_at", window).alias("window"), "gateway_id", "device_id")
        .agg(
            F.count(F.lit(1)).alias("readings"),
            F.min("temperature").alias("temperature_min"),
            F.avg("temperature").alias("temperature_avg"),
            F.max("temperature").alias("temperature_max"),
            F.avg("set_point").alias("set_point_avg"),
            F.max_by("set_point", "reading_ms").alias("set_point_last"),
            F.avg(F.col("heater").cast("double")).alias("heater_duty_cycle"),
        )
        .select(
            "gateway_id", "device_id",
            F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
            "readings", "temperature_min", "temperature_avg", "temperature_max", "set_point_avg",
            "set_point_last", "heater_duty_cycle",
            F.date_format("window.start", "yyyy-MM-dd").alias("date"),
        )
    )
