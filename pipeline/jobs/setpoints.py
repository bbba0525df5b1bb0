"""The set-point change log: one row each time a thermostat's set point differs from its previous reading.

The first reading of a thermostat that the job has seen is logged too, with ``previous_set_point`` null:
it is where the log starts. (A batch run over a slice of the landing zone therefore starts its log at the
slice's first reading.) Readings are ordered by reading time, ties by message id.

Two implementations of that one rule, held equal by tests/pipeline/test_stream.py: batch runs Spark's
``lag`` window function in the JVM (a pandas call per thermostat cost several times more at a few
thousand thermostats), over the few readings that can matter (``_changes_batch``); streaming, where Spark
has no ordered windows, runs ``step`` as an ``OrderedFold`` that keeps the last set point per thermostat
in its state."""

from __future__ import annotations

import pandas as pd
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.jobs.ordered import OrderedFold, StreamTiming
from pipeline.jobs.schemas import SETPOINT_CHANGES_OUTPUT


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
    return out[SETPOINT_CHANGES_OUTPUT.names], {"set_point": float(rows["set_point"].iloc[-1])}


FOLD = OrderedFold(
    keys=("gateway_id", "device_id"),
    time_ms="reading_ms",
    columns=("reading_ms", "message_id", "set_point", "temperature"),
    output=SETPOINT_CHANGES_OUTPUT.ddl,
    step=step,
    dedup=True,
)


def changes(readings: DataFrame, timing: StreamTiming | int | None = None) -> DataFrame:
    """``timing``: streaming (each thermostat's readings closed by its own progress); None: batch."""
    logged = FOLD.stream(readings, timing) if timing is not None else _changes_batch(readings)
    return SETPOINT_CHANGES_OUTPUT.select(logged, {
        "changed_at": F.timestamp_millis("changed_ms"),
        "date": F.date_format(F.timestamp_millis("changed_ms"), "yyyy-MM-dd"),
    })


# The tumbling time bucket of ``_changes_batch`` (chosen by measurement, bench/RESULTS-pipeline.md): long
# enough that a partial aggregate shrinks the readings before its shuffle, short enough that a set point
# rarely returns to an earlier value inside one bucket.
BUCKET_MS = 60 * 60_000


def _changes_batch(readings: DataFrame) -> DataFrame:
    """``lag`` over the readings that can be changes, and the readings that precede them, only.

    A thermostat's set point changes every few hours: ordering all its readings (a shuffle and a sort of
    every reading) to find a handful of changes was most of this output's cost. Instead, a hash aggregate
    with partial aggregation before its shuffle summarises each thermostat's readings per (bucket, set
    point) "group": the first and the last reading time. Within a bucket whose groups' time spans do not
    overlap, each set point is one run, so the only changes are the first readings of its groups (at the
    group's first time); a group's first reading is no change when the group before it in time (the
    previous bucket's last) has the same set point. A bucket whose spans overlap (A-B-A, ties in time
    between set points) or that holds a zero set point (-0.0 equals 0.0 but is written as it is) is
    "mixed": all its readings are taken. The exact ``lag`` then runs over the readings so chosen; what it
    leaves out are readings equal to the one before them, all non-zero, so every reading it keeps has the
    same previous set point, to the bit, as among all the readings (tests/pipeline/test_setpoint_log.py
    holds the two equal on adversarial data).
    """
    keys = list(FOLD.keys)
    bucketed = readings.withColumn("_bucket", F.expr(f"reading_ms div {BUCKET_MS}"))  # monotone in time
    groups = bucketed.groupBy(*keys, "_bucket", "set_point").agg(
        F.min("reading_ms").alias("_first_ms"), F.max("reading_ms").alias("_last_ms"))
    in_time = Window.partitionBy(*keys).orderBy("_first_ms", "_last_ms", "set_point")
    bucket = Window.partitionBy(*keys, "_bucket")
    # Earlier buckets end before this one starts, so a span that reaches a group's start is in its bucket.
    overlaps = F.col("_first_ms") <= F.max("_last_ms").over(in_time.rowsBetween(Window.unboundedPreceding, -1))
    flagged = groups.withColumn("_mixed", F.coalesce(overlaps, F.lit(False)) | (F.col("set_point") == 0))
    mixed = flagged.withColumn("_mixed", F.max("_mixed").over(bucket))
    may_change = F.coalesce(  # null: the thermostat's first group
        F.lag("_mixed").over(in_time) | (F.lag("set_point").over(in_time) != F.col("set_point")), F.lit(True))
    once_per_mixed_bucket = F.col("_first_ms") == F.min("_first_ms").over(bucket)
    wanted = mixed.withColumn("_wanted", F.when(F.col("_mixed"), once_per_mixed_bucket).otherwise(may_change))
    wanted = wanted.where("_wanted").select(
        *[F.col(name).alias(f"_wanted_{name}") for name in (*keys, "_bucket", "_mixed", "_first_ms")])
    taken = bucketed.join(
        F.broadcast(wanted),
        [*[bucketed[name] == wanted[f"_wanted_{name}"] for name in (*keys, "_bucket")],
         wanted["_wanted__mixed"] | (bucketed["reading_ms"] == wanted["_wanted__first_ms"])],
        "left_semi",
    )
    order = Window.partitionBy(*keys).orderBy("reading_ms", "message_id")
    previous = taken.withColumn("previous_set_point", F.lag("set_point").over(order))
    changed = previous.where(~F.col("set_point").eqNullSafe(F.col("previous_set_point")))
    return changed.withColumnRenamed("reading_ms", "changed_ms").select(*SETPOINT_CHANGES_OUTPUT.names)
