"""Reading the landing zone, as a batch DataFrame or as a Structured Streaming file source.

Both read the same sealed files (``<kind>/date=*/hour=*/*.jsonl``) with the same explicit schema and add
the same timestamp columns, so everything downstream is shared. In-progress files are hidden and never
match; sealed files never change, as the streaming file source requires.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.jobs.schemas import HIL_TIMELINE, LANDING
from pipeline.landing import SEALED_GLOB


@dataclass(frozen=True)
class StreamOptions:
    max_files_per_trigger: int | None = None


def landing_glob(landing: str, kind: str) -> str:
    return f"{str(landing).rstrip('/')}/{kind}/{SEALED_GLOB}"


def read_landing(spark: SparkSession, landing: str, kind: str, stream: StreamOptions | None = None) -> DataFrame:
    if stream is None:
        frame = _read_json(spark, landing_glob(landing, kind), LANDING)
    else:
        if "://" not in str(landing):
            Path(landing, kind).mkdir(parents=True, exist_ok=True)
        reader = spark.readStream.schema(LANDING)
        if stream.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", stream.max_files_per_trigger)
        frame = reader.json(landing_glob(landing, kind))
    return with_times(frame)


def with_times(frame: DataFrame) -> DataFrame:
    return frame.withColumns(
        {
            "received_at": F.timestamp_millis("received_ms"),
            "enqueued_at": F.timestamp_millis("enqueued_ms"),
        }
    )


def read_hil(spark: SparkSession, folder: str) -> DataFrame:
    """HIL timelines: every ``*.jsonl`` under ``folder``, at any depth."""
    return _read_json(spark, str(folder), HIL_TIMELINE, recursiveFileLookup="true", pathGlobFilter="*.jsonl")


def _read_json(spark: SparkSession, path: str, schema, **options) -> DataFrame:
    try:
        return spark.read.schema(schema).options(**options).json(path)
    except AnalysisException as error:
        if "PATH_NOT_FOUND" not in str(error) and "Path does not exist" not in str(error):
            raise
        return spark.createDataFrame([], schema)  # nothing landed yet: an empty input, not an error
