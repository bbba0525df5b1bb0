"""Thermostat telemetry: parse the JSON payload with the explicit schema, and split readings from rejects.

A reject is a row that parsed as an event at the ingest but is not a valid reading: not text, not a JSON
object, a field missing or of the wrong type, or a ``device`` that disagrees with the gateway's
``gw-device-id``. Rejects go to the quarantine output with the reason, beside what the ingest itself
quarantined (bad envelopes), so one table answers "what did we not count, and why".
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.jobs.schemas import CORRUPT, QUARANTINE_OUTPUT, TELEMETRY, TELEMETRY_PARSE

TELEMETRY_OUTPUT = "data"

# Numeric fields of a reading: NaN and +-Infinity (Python's json.dumps writes them, Spark's parser reads
# them) are quarantined, never averaged.
_FINITE_FIELDS = ("temperature", "set_point")
_FIELD_REASONS = [
    ("temperature", "temperature is missing or not a number"),
    ("set_point", "set_point is missing or not a number"),
    ("heater", "heater is missing or not a boolean"),
    ("ts_ms", "ts_ms is missing or not an integer"),
    ("device", "device is missing or not a string"),
]


def annotate(rows: DataFrame, is_telemetry: Column | None = None) -> DataFrame:
    """``rows`` with the telemetry payload's fields (``t_<field>``) and ``reason`` (null for a valid
    reading) on the telemetry events; other rows keep their ``reason`` and get null fields.

    Compaction runs it once per landing line (``bronze.parse_payloads``), so no job parses a payload."""
    is_telemetry = F.col("output") == TELEMETRY_OUTPUT if is_telemetry is None else is_telemetry
    parsed = rows.withColumn("t", F.when(is_telemetry, F.from_json(
        "payload", TELEMETRY_PARSE, {"columnNameOfCorruptRecord": CORRUPT})))
    return parsed.withColumn("reason", F.when(is_telemetry, _reason(F.col("t"))).otherwise(F.col("reason"))).select(
        "*", *[F.col(f"t.{field.name}").alias(f"t_{field.name}") for field in TELEMETRY.fields]
    ).drop("t")


def parse(events: DataFrame) -> DataFrame:
    """The telemetry events of bronze rows (``annotate``d already), ``reason`` null for a valid reading."""
    return events.where(F.col("output") == TELEMETRY_OUTPUT)


def _reason(t: Column) -> Column:
    not_an_object = F.from_json("payload", "map<string,string>").isNull()
    reason = F.when(F.col("payload").isNull(), F.lit("payload is not UTF-8 text"))
    reason = reason.when(t.isNull() | (t[CORRUPT].isNotNull() & not_an_object), F.lit("payload is not a JSON object"))
    for field, text in _FIELD_REASONS:
        reason = reason.when(t[field].isNull(), F.lit(text))
        if field in _FINITE_FIELDS:
            reason = reason.when(F.isnan(t[field]) | (F.abs(t[field]) == float("inf")),
                                 F.lit(f"{field} is not a finite number"))
    return reason.when(
        t["device"] != F.col("device_id"),
        F.concat(F.lit("device '"), t["device"], F.lit("' does not match gw-device-id '"), F.col("device_id"), F.lit("'")),
    )


def readings(parsed: DataFrame, copy_order: bool = True) -> DataFrame:
    """Valid readings. ``copy_order``: with the columns that say which copy of a message comes first
    (``dedup.COPY_ORDER``), which streaming needs; batch passes rows deduplicated already."""
    return parsed.where(F.col("reason").isNull()).select(
        "message_id", "gateway_id", "device_id", "priority", "enqueued_ms", "received_ms",
        *(("sent_ms", "landing_file") if copy_order else ()),
        F.col("t_ts_ms").alias("reading_ms"),
        F.timestamp_millis("t_ts_ms").alias("reading_at"),
        F.col("t_temperature").alias("temperature"),
        F.col("t_set_point").alias("set_point"),
        F.col("t_heater").alias("heater"),
    )


def rejects(parsed: DataFrame) -> DataFrame:
    """Telemetry rows that are not readings, in the quarantine layout."""
    return as_quarantine(parsed.where(F.col("reason").isNotNull()), "telemetry")


def as_quarantine(frame: DataFrame, stage: str) -> DataFrame:
    """Landing-zone quarantine rows (``stage="ingest"``), lines that are not landing records
    (``"landing"``) or telemetry rejects, in the quarantine's layout (``schemas.QUARANTINE_OUTPUT``)."""
    at = F.timestamp_millis("received_ms")
    return QUARANTINE_OUTPUT.select(frame, {"stage": F.lit(stage), "received_at": at, "date": F.date_format(at, "yyyy-MM-dd")})
