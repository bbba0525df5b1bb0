"""At-least-once delivery upstream means duplicates: keep the first copy of each message id.

Batch keeps the earliest received copy (a window function, exact). Streaming keeps the first copy it sees
and remembers the id until the watermark passes the copy's event time plus the lateness
(``dropDuplicatesWithinWatermark``), so state stays bounded; a copy arriving later than that is late data
in any case. When copies land in receive order - the ingest writes them that way - both keep the same one.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

KEY = "message_id"


def first_copies(frame: DataFrame, time_column: str, lateness: str, streaming: bool) -> DataFrame:
    """One row per message id. ``time_column`` is the event-time column the caller's windows use."""
    if streaming:
        return frame.withWatermark(time_column, lateness).dropDuplicatesWithinWatermark([KEY])
    order = Window.partitionBy(KEY).orderBy(F.col("received_ms").asc_nulls_last())
    return frame.withColumn("_copy", F.row_number().over(order)).where(F.col("_copy") == 1).drop("_copy")
