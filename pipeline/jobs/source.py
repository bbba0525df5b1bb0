"""What the jobs read besides the bronze table's columns: which landing files exist, how bronze rows split
into records and bad lines, the time columns, and the HIL timelines.

The landing zone's sealed files (``<kind>/date=*/hour=*/*.jsonl``) are read once, by the compaction into
the bronze table (``bronze.py``); the jobs read that table. In-progress files are hidden and never match;
sealed files never change, as the streaming file source requires. A bronze row that is not a landing
record has a ``landing_error``: ``records`` keeps the others, ``bad_lines`` those (for the quarantine).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.jobs.schemas import HIL_TIMELINE
from pipeline.landing import SEALED_GLOB


@dataclass(frozen=True)
class StreamOptions:
    max_files_per_trigger: int | None = None


def landing_glob(landing: str, kind: str) -> str:
    return f"{str(landing).rstrip('/')}/{kind}/{SEALED_GLOB}"


def records(frame: DataFrame) -> DataFrame:
    return frame.where(F.col("landing_error").isNull())


def bad_lines(frame: DataFrame) -> DataFrame:
    """Lines that are not landing records, with ``reason`` in the quarantine's sense."""
    return frame.where(F.col("landing_error").isNotNull()).withColumn("reason", F.col("landing_error"))


def with_times(frame: DataFrame) -> DataFrame:
    return frame.withColumns(
        {
            "received_at": F.timestamp_millis("received_ms"),
            "enqueued_at": F.timestamp_millis("enqueued_ms"),
        }
    )


def read_hil(spark: SparkSession, folder: str) -> DataFrame:
    """HIL timelines: every ``*.jsonl`` under ``folder``, at any depth."""
    frame = _read_json(spark, str(folder), HIL_TIMELINE, recursiveFileLookup="true", pathGlobFilter="*.jsonl")
    return frame if frame is not None else spark.createDataFrame([], HIL_TIMELINE)


def _read_json(spark: SparkSession, path: str | list[str], schema, **options) -> DataFrame | None:
    """The files at ``path`` read with ``schema``; None when there are none."""
    try:
        return spark.read.schema(schema).options(**options).json(path)
    except AnalysisException as error:
        if "PATH_NOT_FOUND" not in str(error) and "Path does not exist" not in str(error):
            raise
        return None
