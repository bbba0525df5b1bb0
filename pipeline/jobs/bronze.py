"""The bronze table: every landing line read once, ever, parsed and typed once, kept as partitioned Parquet.

The JSON landing zone is what the ingest can make durable line by line (append, fsync, then PUBACK); it is
the wrong thing to read on every run of every job, because parsing the lines - the envelope, then the
payload inside it - is most of Spark's time. So ``compact`` moves sealed landing files into this table with
Structured Streaming queries (``availableNow`` in ``pipeline compact`` and before ``batch``; continuous
beside ``stream``), and every job reads the table, never the JSON::

    BRONZE/<kind>/date=YYYY-MM-DD/part-*.parquet   kind: events, metrics, quarantine
    BRONZE/<kind>/_spark_metadata/   the file sink's commit log: the files that are the table
    BRONZE/<kind>/_checkpoint/       the query's offsets and source log: the landing files already read

Rules
-----
* A table and a query per kind, each with its own log: a job reads only the kinds it needs, and a
  streaming job's micro-batch of N bronze files is N landing files of its kind.
* A row per landing line, blank lines aside: a landing record's fields as they were
  (``schemas.LANDING``), plus what the jobs would otherwise parse again on every read: the telemetry
  payload's fields (``t_temperature`` ... ``t_ts_ms``) with ``reason`` already the telemetry reject's
  reason (events of output ``data``; ``telemetry.annotate``), and the metrics payload (``metrics_doc``,
  ``schemas.METRICS``).
* A line that is not a landing record is kept too, raw in ``payload``, with ``landing_error``
  (``landing_lines``), so the quarantine still sees it.
* ``landing_file`` and ``received_ms`` / ``sent_ms`` are kept so that "the earliest copy wins" does not
  depend on the order the files were compacted in. ``date`` is the landing partition's receive date, so a
  batch over dates reads only those partitions.
* Every line is exactly one row: lines are read as text and parsed with ``from_json``, where Spark's JSON
  source would make a JSON array its elements (or nothing for ``[]``). That reading is slower than the JSON
  source, and it is paid once per line, here.
* Exactly once: each query's checkpoint records which landing files each micro-batch took before it runs,
  and the Parquet sink lists a micro-batch's files in ``_spark_metadata`` only when all are written.

Theory of operation
-------------------
A compaction killed at any point starts again from its last committed micro-batch; files a killed attempt
wrote are in no log, and readers that go through the log (``read``: Spark reading a table's root) never
see them. The checkpoint lives inside the table: deleting the table deletes the record of what it read, so
the next compaction reads the landing zone again from the start instead of skipping it.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from pipeline.jobs import telemetry
from pipeline.jobs.files import HadoopFiles
from pipeline.jobs.schemas import LANDING, METRICS, TELEMETRY
from pipeline.jobs.source import StreamOptions, landing_glob, with_times
from pipeline.records import EVENTS, KINDS
from pipeline.records import METRICS as METRICS_KIND

METRICS_DOC = "metrics_doc"
CORRUPT_LINE = "_corrupt_line"
LANDING_READ = T.StructType(LANDING.fields + [T.StructField(CORRUPT_LINE, T.StringType())])
NOT_A_RECORD = "landing line is not a JSON record (cut short?)"
NO_RECEIVE_TIME = "landing record has no received_ms"
PARTITION = "date"
CHECKPOINT = "_checkpoint"

SCHEMA = T.StructType(
    LANDING.fields
    + [
        T.StructField("landing_error", T.StringType()),
        T.StructField("landing_file", T.StringType()),
        *[T.StructField(f"t_{field.name}", field.dataType) for field in TELEMETRY.fields],
        T.StructField(METRICS_DOC, METRICS),
        T.StructField("kind", T.StringType()),
        T.StructField("date", T.StringType()),
    ]
)


# Parquet's min/max statistics of the raw payloads: every payload compared with its page's min and max,
# for statistics no reader can prune by (a payload is never a filter).
WRITE_OPTIONS = {"parquet.column.statistics.enabled#payload": "false"}


@dataclass(frozen=True)
class Compacted:
    input_rows: int
    micro_batches: int


def parse_payloads(lines: DataFrame) -> DataFrame:
    """Landing rows (``LANDING``, ``landing_error``, ``landing_file``, ``kind``) with their payloads parsed:
    the bronze columns. Compaction runs it once per line, ``from_records`` on rows held in memory."""
    record = F.col("landing_error").isNull()
    is_telemetry = record & (F.col("kind") == EVENTS) & (F.col("output") == telemetry.TELEMETRY_OUTPUT)
    annotated = telemetry.annotate(lines, is_telemetry)
    is_metrics = record & (F.col("kind") == METRICS_KIND)
    return annotated.withColumn(METRICS_DOC, F.when(is_metrics, F.from_json("payload", METRICS)))


def _landing_lines(spark: SparkSession, landing: str, kind: str, options: StreamOptions) -> DataFrame:
    """One kind's sealed landing files as a stream of rows, one per non-blank line (``landing_lines``)."""
    reader = spark.readStream
    if options.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", options.max_files_per_trigger)
    return landing_lines(reader.text(landing_glob(landing, kind)), kind)


def landing_lines(text: DataFrame, kind: str) -> DataFrame:
    """Text lines (``value``, ``_metadata``) of landing files as landing rows of ``kind``.

    A line that is not a landing record - cut short by a full disk or an interrupted copy, not JSON, not
    an object, or an object without ``received_ms`` - is kept, not lost: a ``landing_error``, the raw line
    as its ``payload`` and, since its own receive time is unreadable, the start of its file's hour
    partition as ``received_ms``. ``landing_file`` says which file a row came from: among copies of a
    message received in the same millisecond, the one in the first file by name is kept (``dedup.py``).
    """
    # Spark keeps a line's bytes as they are. The parser decodes them (invalid UTF-8 as U+FFFD), so the
    # fields of a record are valid text; the raw line kept as a bad line's payload is made valid here, so
    # that every reader of it (pyarrow, the report) can decode it. Only there: checking every line's bytes
    # was a tenth of compaction's time.
    parsed = text.where(F.trim("value") != "").select(
        F.from_json("value", LANDING_READ, {"columnNameOfCorruptRecord": CORRUPT_LINE}).alias("record"),
        F.col("value").alias("line"), F.col("_metadata.file_path").alias("landing_file"),
    )
    # from_json reads a line of whitespace other than spaces as no field at all: only "{" opens a record.
    # A record's line starts with it (the ingest writes no space before), and that test looks at one byte;
    # the regular expression, which decodes the whole line to a Java string first, only sees the others.
    opens_an_object = F.col("line").startswith("{") | F.col("line").rlike(r"^[ \t]*\{")
    not_a_record = F.col(f"record.{CORRUPT_LINE}").isNotNull() | ~opens_an_object
    error = F.when(not_a_record, F.lit(NOT_A_RECORD)).when(F.col("record.received_ms").isNull(), F.lit(NO_RECEIVE_TIME))
    path = F.col("landing_file")
    hour_start = F.unix_millis(F.to_timestamp(F.concat(
        F.regexp_extract(path, r"date=(\d{4}-\d{2}-\d{2})", 1), F.lit(" "), F.regexp_extract(path, r"hour=(\d{2})", 1)
    ), "yyyy-MM-dd HH"))
    rows = parsed.select(*[F.col(f"record.{field.name}") for field in LANDING.fields], "line", "landing_file",
                         error.alias("landing_error"))
    return rows.withColumns({
        "received_ms": F.coalesce(F.col("received_ms"), hour_start),
        "payload": F.when(F.col("landing_error").isNotNull(), F.make_valid_utf8("line")).otherwise(F.col("payload")),
        "kind": F.lit(kind),
        "date": F.regexp_extract(path, r"date=(\d{4}-\d{2}-\d{2})", 1),
    }).drop("line")


def table(bronze: str, kind: str) -> str:
    """The folder of one kind's table."""
    return f"{str(bronze).rstrip('/')}/{kind}"


def start_compaction(spark: SparkSession, landing: str, bronze: str, options: StreamOptions | None = None,
                     once: bool = True, trigger_seconds: float = 60.0,
                     kinds: tuple[str, ...] = KINDS) -> list[StreamingQuery]:
    """The compaction queries, one per kind, started: ``once`` takes what has landed and stops, else each
    runs every ``trigger_seconds``."""
    options = options or StreamOptions()
    queries = []
    for kind in kinds:
        _make_dir(spark, f"{str(landing).rstrip('/')}/{kind}")
        lines = parse_payloads(_landing_lines(spark, landing, kind, options)).select(*SCHEMA.fieldNames())
        if options.max_files_per_trigger:  # a streaming job's paced input: one ordered file per date (``read``)
            lines = lines.coalesce(1)
        writer = (
            lines.writeStream.queryName(f"bronze-{kind}").format("parquet").outputMode("append")
            .partitionBy(PARTITION).option("checkpointLocation", f"{table(bronze, kind)}/{CHECKPOINT}")
            .options(**WRITE_OPTIONS)
        )
        writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=f"{trigger_seconds} seconds")
        queries.append(writer.start(table(bronze, kind)))
    return queries


def compact(spark: SparkSession, landing: str, bronze: str, options: StreamOptions | None = None,
            kinds: tuple[str, ...] = KINDS) -> Compacted:
    """Move every sealed landing file not compacted yet into the tables, then return (``availableNow``)."""
    queries = start_compaction(spark, landing, bronze, options, once=True, kinds=kinds)
    for query in queries:
        query.awaitTermination()
    done = [progress for query in queries for progress in query.recentProgress]
    return Compacted(sum(progress.get("numInputRows", 0) or 0 for progress in done),
                     sum(1 for progress in done if progress.get("numInputRows")))


def read(spark: SparkSession, bronze: str, kind: str | None = None, dates: list[str] | None = None,
         stream: StreamOptions | None = None) -> DataFrame:
    """One ``kind``'s table (all three: None), some receive ``dates`` of it, as the jobs read it: from the
    table's root, so through the sink's log. ``stream``: as a streaming source of the files compaction
    commits, in commit order.

    A streaming micro-batch must never take part of a compaction micro-batch and leave the rest for later:
    the files of one are in no particular order, and a key's newer rows read before its older ones would
    make those late. Unpaced, a micro-batch takes every committed file (whole compaction micro-batches).
    Paced (``max_files_per_trigger``), compaction writes each micro-batch as one file per date, in date
    order, and a micro-batch here takes one file: the same landing files, as far as they are of one date."""
    if kind is None:
        kinds = [read(spark, bronze, each, dates, stream) for each in KINDS]
        return functools.reduce(DataFrame.unionByName, kinds)
    path = table(bronze, kind)
    _make_dir(spark, path)
    if stream is None:
        frame = spark.read.schema(SCHEMA).parquet(path)
    else:
        reader = spark.readStream.schema(SCHEMA)
        if stream.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", 1)
        frame = reader.parquet(path)
    if dates is not None:
        frame = frame.where(F.col(PARTITION).isin(dates))
    return with_times(frame)


class RebuildRefused(Exception):
    """A kind's table cannot be rebuilt whole: landing files it was made of are gone."""


def landing_files_read(spark: SparkSession, bronze: str, kind: str) -> list[str]:
    """The landing files a kind's compaction has read, from its checkpoint's source log (JSON lines with a
    ``path``, the compacted ``N.compact`` files included): what the table was made of."""
    files = HadoopFiles(spark)
    paths = set()
    for log in files.children(f"{table(bronze, kind)}/{CHECKPOINT}/sources/0"):
        for line in files.read_text(log).splitlines():
            if line.startswith("{"):
                paths.add(json.loads(line)["path"])
    return sorted(paths)


def rebuild(spark: SparkSession, landing: str, bronze: str, kind: str, force: bool = False) -> tuple[str, Compacted]:
    """Rebuild one kind's table from the landing files (a corrupt or lost Parquet file): the table and its
    checkpoint are moved aside (``<kind>.replaced-<ms>``, kept for inspection), and the kind is compacted
    again from every landing file there is. Refused (``RebuildRefused``) when landing files the table was
    made of are gone (archived after compaction): the rebuilt table would lack their rows; ``force``
    rebuilds anyway. Returns where the old table went, and what the compaction read."""
    files = HadoopFiles(spark)
    read = landing_files_read(spark, bronze, kind)
    missing = [path for path in read if not files.exists(path)]
    if missing and not force:
        raise RebuildRefused(f"{len(missing)} of the {len(read)} landing files the {kind} table was made of are gone "
                             f"(first: {missing[0]}); restore them first, or --force to rebuild without their rows")
    aside = f"{table(bronze, kind)}.replaced-{int(time.time() * 1000)}"
    if files.exists(table(bronze, kind)):
        files.rename(table(bronze, kind), aside)
    return aside, compact(spark, landing, bronze, kinds=(kind,))


def _make_dir(spark: SparkSession, path: str) -> None:
    """Through Hadoop's FileSystem (any store): a folder a reader or a streaming source can start on."""
    HadoopFiles(spark).mkdirs(path)


def from_records(spark: SparkSession, rows: list[dict], landing_file: str = "memory", kind: str = EVENTS) -> DataFrame:
    """Landing records held in memory as bronze rows of ``kind``, as ``records(read(...))`` gives them
    (tests, tools)."""
    frame = spark.createDataFrame(rows, LANDING).withColumns({
        "landing_error": F.lit(None).cast("string"), "landing_file": F.lit(landing_file), "kind": F.lit(kind),
    })
    return with_times(parse_payloads(frame))
