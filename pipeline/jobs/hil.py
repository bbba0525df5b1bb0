"""HIL run analysis from the bench's timelines (record schema in docs/pipeline.md).

Per message: when the bench sent it, when it first reached the cloud side, how many copies arrived, and
whether the gateway expired it. From that:

* ``hil_summary`` per run, scenario and priority: sent, delivered, duplicates, expired, lost (sent, never
  delivered, not expired), expired-but-delivered, and latency p50/p95/p99/max (first receipt - sent).
* ``hil_timeline`` per run and second (``t_ms`` floored to 1 s): sent, delivered and expired in that second;
  the backlog at its end (sent so far - delivered so far - expired so far); and the link as the rig had it
  (up/down, rate, delay, loss), from the rig commands it accepted (``RATE``, ``DELAY``, ``LOSS``, ``DOWN``,
  ``UP``, ``RESET``, and the values a ``STATUS`` reply reports), carried forward. ``rate_bps`` 0 means
  unshaped, as in the rig protocol.

Runs are short and analysed after the fact, so this is batch only.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.jobs.schemas import RIG_DETAIL

RUN = ("run_id", "scenario")
LINK = ("link", "rate_bps", "delay_ms", "loss_pct")


def per_message(timeline: DataFrame) -> DataFrame:
    messages = timeline.where(F.col("event") != "rig")
    return messages.groupBy(*RUN, "message_id").agg(
        F.min("priority").alias("priority"),
        F.min(F.when(F.col("event") == "sent", F.col("t_ms"))).alias("sent_ms"),
        F.min(F.when(F.col("event") == "received", F.col("t_ms"))).alias("received_ms"),
        F.count(F.when(F.col("event") == "received", 1)).alias("receipts"),
        F.min(F.when(F.col("event") == "expired", F.col("t_ms"))).alias("expired_ms"),
    )


def summary(timeline: DataFrame) -> DataFrame:
    messages = per_message(timeline).withColumn("latency_ms", F.col("received_ms") - F.col("sent_ms"))
    sent = F.col("sent_ms").isNotNull()
    delivered = F.col("received_ms").isNotNull()
    expired = F.col("expired_ms").isNotNull()
    quantiles = F.percentile_approx("latency_ms", F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99)), 10000)
    return (
        messages.groupBy(*RUN, "priority")
        .agg(
            F.count(F.when(sent, 1)).alias("sent"),
            F.count(F.when(delivered, 1)).alias("delivered"),
            F.sum(F.greatest(F.col("receipts") - 1, F.lit(0))).alias("duplicates"),
            F.count(F.when(expired, 1)).alias("expired"),
            F.count(F.when(sent & ~delivered & ~expired, 1)).alias("lost"),
            F.count(F.when(delivered & expired, 1)).alias("expired_but_delivered"),
            quantiles.alias("q"),
            F.max("latency_ms").alias("latency_max_ms"),
        )
        .select(
            *RUN, "priority", "sent", "delivered", "duplicates", "expired", "lost", "expired_but_delivered",
            F.col("q")[0].alias("latency_p50_ms"), F.col("q")[1].alias("latency_p95_ms"),
            F.col("q")[2].alias("latency_p99_ms"), "latency_max_ms",
        )
    )


def timeline_per_second(timeline: DataFrame) -> DataFrame:
    messages = per_message(timeline)
    happenings = (
        messages.select(*RUN, F.col("sent_ms").alias("t_ms"), F.lit("sent").alias("what"))
        .unionByName(messages.select(*RUN, F.col("received_ms").alias("t_ms"), F.lit("delivered").alias("what")))
        .unionByName(  # a message that expired and still arrived left the backlog once, when it arrived
            messages.select(
                *RUN, F.when(F.col("received_ms").isNull(), F.col("expired_ms")).alias("t_ms"),
                F.lit("expired").alias("what"),
            )
        )
        .where(F.col("t_ms").isNotNull())
        .withColumn("second_ms", F.col("t_ms") - F.col("t_ms") % 1000)
    )
    counts = happenings.groupBy(*RUN, "second_ms").pivot("what", ["sent", "delivered", "expired"]).count().fillna(0)

    rig = rig_settings(timeline).withColumn("second_ms", F.col("t_ms") - F.col("t_ms") % 1000)
    rig_per_second = rig.groupBy(*RUN, "second_ms").agg(  # the last value each setting had in the second
        *[F.max_by(name, F.when(F.col(name).isNotNull(), F.col("t_ms"))).alias(name) for name in LINK]
    )
    seconds = counts.join(rig_per_second, [*RUN, "second_ms"], "full").fillna(0, ["sent", "delivered", "expired"])
    so_far = Window.partitionBy(*RUN).orderBy("second_ms").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return seconds.select(
        *RUN, "second_ms",
        F.col("sent").cast("long").alias("sent"), F.col("delivered").cast("long").alias("delivered"),
        F.col("expired").cast("long").alias("expired"),
        (F.sum("sent").over(so_far) - F.sum("delivered").over(so_far) - F.sum("expired").over(so_far))
        .cast("long").alias("backlog"),
        *[F.last(name, ignorenulls=True).over(so_far).alias(name) for name in LINK],
    )


def rig_settings(timeline: DataFrame) -> DataFrame:
    """One row per rig command the rig answered ``OK`` to: the settings it set (null: left as they were)."""
    rig = timeline.where(F.col("event") == "rig").select(*RUN, "t_ms", F.from_json("detail", RIG_DETAIL).alias("d"))
    accepted = rig.where(F.col("d.reply").startswith("OK"))
    words = F.split(F.trim(F.col("d.command")), r"\s+")
    verb, argument = F.upper(F.get(words, 0)), F.get(words, 1).try_cast("double")

    def reported(key: str):  # a value in a STATUS reply: "OK backend=... up=1 rate=9600 ... loss=2.5"
        return F.regexp_extract(F.col("d.reply"), rf"\b{key}=([0-9.]+)", 1).try_cast("double")

    def setting(command: str, reset_to: float):
        value = F.when(verb == command, argument).when(verb == "RESET", F.lit(reset_to))
        return value.when(verb == "STATUS", reported(command.lower()))

    link = (
        F.when(verb == "DOWN", F.lit("down"))
        .when(verb.isin("UP", "RESET"), F.lit("up"))
        .when(verb == "STATUS", F.when(reported("up") == 1, F.lit("up")).when(reported("up") == 0, F.lit("down")))
    )
    return accepted.select(
        *RUN, "t_ms", link.alias("link"), setting("RATE", 0).cast("long").alias("rate_bps"),
        setting("DELAY", 0).alias("delay_ms"), setting("LOSS", 0).alias("loss_pct"),
    )
