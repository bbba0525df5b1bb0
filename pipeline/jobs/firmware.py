"""The fleet's firmware over time: which version each thermostat runs, and every over-the-air update -
when it started and finished, how long it took, how it ended (installed, rolled back, refused, waiting)
and why.

Two sources, both in the gateway's clock (``gw-enqueued-ms``: the thermostat's own clock is not set
while its updater runs, and is what the update may have reset):

* the updater's status messages, output ``update`` (the bronze table's ``firmware`` kind; older firmware
  sent them on ``data`` without ``ts_ms``, the ingest lands those there too): ``{"device", "fw" (running),
  "update": {"state": "downloading", "version", "file", "offset", "reason"}}``;
* the thermostat's readings (``data``), whose ``fw`` is the running version and whose ``update`` is the
  record of the last update while it still stands (``refused``, ``waiting``, ``rolled_back``, with a
  reason), parsed once by compaction (``t_fw``, ``t_update``).

``firmware``: a log, one row each time a thermostat's (running version, update state, update version,
reason) differs from its previous status (the first one too). ``firmware_updates``: one row per
thermostat and target version: ``started_ms`` (its first status naming the version), ``finished_ms``
(the first status that runs it: installed; else the first terminal record, when the outcome was first
reported: ``rolled_back``, ``refused``, ``waiting``; the thermostat repeats it in its readings),
``duration_ms``, ``outcome``, ``reason``, ``from_version`` (running when it started). Batch only (a few rows per thermostat per update).
An updater message that is not a JSON object, or holds neither ``fw`` nor ``update.state``, goes to the
quarantine (stage ``firmware``, ``rejects``), in batch and streaming.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.jobs.schemas import FIRMWARE_STATUS

FIRMWARE_OUTPUT = "update"  # the updater's output name (device_firmware/ota_updater.py)
TERMINAL = ("rolled_back", "refused", "waiting")
KEYS = ("gateway_id", "device_id")


def reject_reason() -> Column:
    """Why an updater message (a ``firmware`` kind row) tells nothing about the firmware, else null: such a
    message is quarantined (stage ``firmware``) rather than left out of the outputs unseen."""
    parsed = F.from_json("payload", FIRMWARE_STATUS)
    return (F.when(F.col("payload").isNull(), F.lit("update status is not UTF-8 text"))
            .when(F.from_json("payload", "map<string,string>").isNull(), F.lit("update status is not a JSON object"))
            .when(parsed["fw"].isNull() & parsed["update"]["state"].isNull(),
                  F.lit("update status has neither fw nor update.state")))


def rejects(updater_rows: DataFrame) -> DataFrame:
    """The updater's messages that ``statuses`` cannot read, with ``reason``."""
    return updater_rows.withColumn("reason", reject_reason()).where(F.col("reason").isNotNull())


def statuses(updater_rows: DataFrame, readings: DataFrame) -> DataFrame:
    """One row per status: the updater's messages (first copies) and the readings' firmware fields."""
    parsed = updater_rows.select(
        "gateway_id", "device_id", "message_id", F.col("enqueued_ms").alias("at_ms"),
        F.from_json("payload", FIRMWARE_STATUS).alias("s"), F.lit("updater").alias("source"))
    from_updater = parsed.select(
        *KEYS, "message_id", "at_ms", "source", F.col("s.fw").alias("running"),
        F.col("s.update.state").alias("update_state"), F.col("s.update.version").alias("update_version"),
        F.col("s.update.reason").alias("update_reason"))
    from_readings = readings.select(
        *KEYS, "message_id", F.col("enqueued_ms").alias("at_ms"), F.lit("thermostat").alias("source"),
        F.col("t_fw").alias("running"), F.col("t_update.state").alias("update_state"),
        F.col("t_update.version").alias("update_version"), F.col("t_update.reason").alias("update_reason"))
    return from_updater.unionByName(from_readings).where(F.col("running").isNotNull() | F.col("update_state").isNotNull())


def log(status: DataFrame) -> DataFrame:
    """``firmware``: the statuses at which something changed, per thermostat in the gateway's time."""
    order = Window.partitionBy(*KEYS).orderBy("at_ms", "message_id")
    described = F.struct("running", "update_state", "update_version", "update_reason")
    changed = status.withColumn("_before", F.lag(described).over(order)).where(
        ~F.col("_before").eqNullSafe(described))
    return changed.select(
        *KEYS, "at_ms", F.timestamp_millis("at_ms").alias("at"), "source", "running", "update_state", "update_version",
        "update_reason", "message_id", F.date_format(F.timestamp_millis("at_ms"), "yyyy-MM-dd").alias("date"))


def updates(status: DataFrame) -> DataFrame:
    """``firmware_updates``: per thermostat and target version, from its first status naming the version
    to the first status running it (installed) or, failing that, its first terminal record."""
    named = status.where(F.col("update_version").isNotNull()).groupBy(*KEYS, "update_version").agg(
        F.min("at_ms").alias("started_ms"),
        # statuses of one gateway time (a clock stepped back) in the log's order: then by message id
        F.min_by("running", F.struct("at_ms", "message_id")).alias("from_version"),
        F.min_by(F.when(F.col("update_state").isin(*TERMINAL), F.struct("at_ms", "update_state", "update_reason")),
                 F.when(F.col("update_state").isin(*TERMINAL), F.struct("at_ms", "message_id"))).alias("_terminal"),
    )
    running = status.where(F.col("running").isNotNull()).select(
        *[F.col(k).alias(f"_ran_{k}") for k in KEYS], F.col("running").alias("_version"), F.col("at_ms").alias("_ran_ms"))
    joined = named.join(running, [named[k] == running[f"_ran_{k}"] for k in KEYS]
                        + [named["update_version"] == running["_version"], running["_ran_ms"] >= named["started_ms"]],
                        "left")
    first_run = joined.groupBy(*KEYS, "update_version", "started_ms", "from_version", "_terminal").agg(
        F.min("_ran_ms").alias("_installed_ms"))
    finished = F.coalesce(F.col("_installed_ms"), F.col("_terminal.at_ms"))
    outcome = F.when(F.col("_installed_ms").isNotNull(), F.lit("installed")).otherwise(
        F.coalesce(F.col("_terminal.update_state"), F.lit("in_progress")))
    return first_run.select(
        *KEYS, F.col("update_version").alias("version"), "from_version", "started_ms",
        F.timestamp_millis("started_ms").alias("started_at"), finished.alias("finished_ms"),
        F.timestamp_millis(finished).alias("finished_at"), (finished - F.col("started_ms")).alias("duration_ms"),
        outcome.alias("outcome"),
        F.when(F.col("_installed_ms").isNull(), F.col("_terminal.update_reason")).alias("reason"),
        F.date_format(F.timestamp_millis("started_ms"), "yyyy-MM-dd").alias("date"))
