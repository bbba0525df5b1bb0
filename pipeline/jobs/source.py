"""Reading the landing zone, as a batch DataFrame or as a Structured Streaming file source.

Both read the same sealed files (``<kind>/date=*/hour=*/*.jsonl``) with the same explicit schema and add
the same columns, so everything downstream is shared. In-progress files are hidden and never match;
sealed files never change, as the streaming file source requires.

A line that is not a landing record - cut short by a full disk or an interrupted copy, or not JSON at
all - is kept, not lost: ``read_landing`` gives it a ``landing_error`` (null on a good line), the raw text
as its ``payload`` and, since its own receive time is unreadable, the start of its file's hour partition
as ``received_ms``. ``records`` keeps the good lines, ``bad_lines`` the others (for the quarantine).
Every row also says which file it came from (``landing_file``): among copies of a message received in
the same millisecond, the one in the first file by name is kept (``dedup.py``), whatever order Spark
reads them in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.jobs.schemas import HIL_TIMELINE, LANDING
from pipeline.landing import SEALED_GLOB

CORRUPT_LINE = "_corrupt_line"
LANDING_READ = T.StructType(LANDING.fields + [T.StructField(CORRUPT_LINE, T.StringType())])
NOT_A_RECORD = "landing line is not a JSON record (cut short?)"
NO_RECEIVE_TIME = "landing record has no received_ms"


@dataclass(frozen=True)
class StreamOptions:
    max_files_per_trigger: int | None = None


def landing_glob(landing: str, kind: str) -> str:
    return f"{str(landing).rstrip('/')}/{kind}/{SEALED_GLOB}"


def read_landing(spark: SparkSession, landing: str, kind: str, stream: StreamOptions | None = None,
                 dates: list[str] | None = None) -> DataFrame:
    """Every line of one kind, good or bad (``landing_error``); see ``records`` and ``bad_lines``.

    ``dates``: only these receive-date partitions (a batch over a date range lists nothing else)."""
    if stream is None:
        paths = [landing_glob(landing, kind)] if dates is None else _existing_dates(spark, landing, kind, dates)
        frame = _read_json(spark, paths, LANDING_READ, columnNameOfCorruptRecord=CORRUPT_LINE) if paths else None
        if frame is None:  # nothing landed yet: an empty input, not an error
            frame = spark.createDataFrame([], LANDING_READ).withColumn(
                "_metadata", F.struct(F.lit(None).cast("string").alias("file_path"))
            )
    else:
        if "://" not in str(landing):
            Path(landing, kind).mkdir(parents=True, exist_ok=True)
        reader = spark.readStream.schema(LANDING_READ).option("columnNameOfCorruptRecord", CORRUPT_LINE)
        if stream.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", stream.max_files_per_trigger)
        frame = reader.json(landing_glob(landing, kind))
    return with_provenance(frame)


def with_provenance(frame: DataFrame) -> DataFrame:
    """``landing_error``, ``landing_file`` and a stand-in ``received_ms`` for bad lines; the time columns."""
    path = F.col("_metadata.file_path")
    error = F.when(F.col(CORRUPT_LINE).isNotNull(), F.lit(NOT_A_RECORD)).when(
        F.col("received_ms").isNull(), F.lit(NO_RECEIVE_TIME)
    )
    hour_start = F.unix_millis(F.to_timestamp(F.concat(
        F.regexp_extract(path, r"date=(\d{4}-\d{2}-\d{2})", 1), F.lit(" "), F.regexp_extract(path, r"hour=(\d{2})", 1)
    ), "yyyy-MM-dd HH"))
    return with_times(
        frame.withColumns(
            {
                "landing_error": error,
                "landing_file": path,
                "received_ms": F.coalesce(F.col("received_ms"), hour_start),
                "payload": F.when(F.col(CORRUPT_LINE).isNotNull(), F.col(CORRUPT_LINE)).otherwise(F.col("payload")),
            }
        ).drop(CORRUPT_LINE)
    )


def records(frame: DataFrame) -> DataFrame:
    return frame.where(F.col("landing_error").isNull())


def bad_lines(frame: DataFrame) -> DataFrame:
    """Lines that are not landing records, with ``reason`` in the quarantine's sense."""
    return frame.where(F.col("landing_error").isNotNull()).withColumn("reason", F.col("landing_error"))


def from_records(spark: SparkSession, rows: list[dict], landing_file: str = "memory") -> DataFrame:
    """Landing records held in memory, as ``records(read_landing(...))`` would give them (tests, tools)."""
    frame = spark.createDataFrame(rows, LANDING)
    return with_times(frame.withColumns({"landing_error": F.lit(None).cast("string"), "landing_file": F.lit(landing_file)}))


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


def _existing_dates(spark: SparkSession, landing: str, kind: str, dates: list[str]) -> list[str]:
    """The sealed-file globs of the ``date=`` partitions of ``kind`` that exist (Hadoop FS: any store)."""
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(f"{str(landing).rstrip('/')}/{kind}")
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    found = fs.globStatus(jvm.org.apache.hadoop.fs.Path(root, "date=*")) if fs.exists(root) else []
    present = {status.getPath().getName().removeprefix("date=") for status in found or []}
    pattern = SEALED_GLOB.split("/", 1)[1]  # hour=*/*.jsonl
    return [f"{root.toString()}/date={day}/{pattern}" for day in dates if day in present]


def _read_json(spark: SparkSession, path: str | list[str], schema, **options) -> DataFrame | None:
    """The files at ``path`` read with ``schema``; None when there are none."""
    try:
        return spark.read.schema(schema).options(**options).json(path)
    except AnalysisException as error:
        if "PATH_NOT_FOUND" not in str(error) and "Path does not exist" not in str(error):
            raise
        return None
