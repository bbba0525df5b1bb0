"""The set-point change log: one row each time a thermostat's set point differs from its previous reading.

The first reading of a thermostat that the job has seen is logged too, with ``previous_set_point`` null:
it is where the log starts. (A batch run over a slice of the landing zone therefore starts its log at the
slice's first reading.) Readings are ordered by reading time, ties by message id.

Two implementations of that one rule, held equal by tests/pipeline/test_stream.py: batch uses
Spark's ``lag`` window function, which runs in the JVM (a pandas call per thermostat cost several times
more at a few thousand thermostats); streaming, where Spark has no ordered windows, runs ``step`` as an
``OrderedFold`` that keeps the last set point per thermostat in its state.
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.jobs.ordered import OrderedFold

OUTPUT = (
    "gateway_id string, device_id string, changed_ms long, previous_set_point double, set_point double, "
    "temperature double, message_id string"
)


def step(key: tuple, last: dict | None, rows: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    previous = rows["set_point"].shift(1, fill_value=last["set_point"] if last else float("nan"))
    changed = rows["set_point"].ne(previous)  # NaN != anything: the first reading ever is a change
    out = pd.DataFrame(
        {
            "gateway_id": key[0],
            "device_id": key[1],
            "changed_ms": rows["reading_ms"][changed],
            "previous_set_point": previous[changed],
            "set_point": rows["set_point"][changed],
            "temperature": rows["temperature"][changed],
            "message_id": rows["message_id"][changed],
        }
    )
    return out, {"set_point": float(rows["set_point"].iloc[-1])}


FOLD = OrderedFold(
    keys=("gateway_id", "device_id"),
    time_ms="reading_ms",
    columns=("reading_ms", "message_id", "set_point", "temperature"),
    output=OUTPUT,
    step=step,
    dedup=True,
)


def changes(readings: DataFrame, lateness_ms: int | None = None) -> DataFrame:
    """``lateness_ms``: streaming (each thermostat's readings closed by its own progress); None: batch."""
    logged = FOLD.stream(readings, lateness_ms) if lateness_ms is not None else _changes_batch(readings)
    return logged.withColumns(
        {
            "changed_at": F.timestamp_millis("changed_ms"),
            "date": F.date_format(F.timestamp_millis("changed_ms"), "yyyy-MM-dd"),
        }
    )


def _changes_batch(readings: DataFrame) -> DataFrame:
    order = Window.partitionBy(*FOLD.keys).orderBy("reading_ms", "message_id")
    previous = readings.withColumn("previous_set_point", F.lag("set_point").over(order))
    return previous.where(~F.col("set_point").eqNullSafe(F.col("previous_set_point"))).select(
        "gateway_id", "device_id", F.col("reading_ms").alias("changed_ms"), "previous_set_point", "set_point",
        "temperature", "message_id",
    )
