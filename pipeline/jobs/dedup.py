"""At-least-once delivery upstream means duplicates: keep one copy of each message id.

Batch keeps the earliest received copy; copies received in the same millisecond are ordered by the
landing file they are in, then by send time, so the copy kept never depends on the order Spark reads
files in. Streaming keeps the first copy it sees and remembers the id until the watermark passes the
copy's event time plus the lateness (``dropDuplicatesWithinWatermark``), so state stays bounded.

Ingest rejects are deduplicated too: a malformed message that was redelivered is one problem, not two.
Their key is the message id when the ingest could read one, else the content (topic, payload, user
properties), which a redelivery repeats exactly.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

KEY = "message_id"
COPY_ORDER = ("received_ms", "landing_file", "sent_ms")
REJECT_KEY = "_reject_key"


def first_copies(frame: DataFrame, time_column: str, lateness: str, streaming: bool, key: str = KEY) -> DataFrame:
    """One row per ``key``. ``time_column`` is the event-time column the caller's windows use."""
    if streaming:
        return frame.withWatermark(time_column, lateness).dropDuplicatesWithinWatermark([key])
    order = Window.partitionBy(key).orderBy(*[F.col(name).asc_nulls_last() for name in COPY_ORDER])
    return frame.withColumn("_copy", F.row_number().over(order)).where(F.col("_copy") == 1).drop("_copy")


def reject_key() -> Column:
    """What names an ingest reject across its redeliveries."""
    content = F.concat_ws(
        "\u001f", F.col("topic"), F.coalesce(F.col("payload"), F.lit("")),
        F.coalesce(F.col("payload_base64"), F.lit("")), F.to_json(F.array_sort(F.map_entries("properties"))),
    )
    return F.coalesce(F.col(KEY), F.concat(F.lit("sha256:"), F.sha2(content, 256)))


def first_rejects(frame: DataFrame, lateness: str, streaming: bool) -> DataFrame:
    """Ingest rejects, one per rejected message (see the module's docstring)."""
    keyed = frame.withColumn(REJECT_KEY, reject_key())
    return first_copies(keyed, "received_at", lateness, streaming, key=REJECT_KEY).drop(REJECT_KEY)
