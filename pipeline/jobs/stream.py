"""The incremental job: the same outputs as batch (HIL and the joined ``sla`` aside), with Structured
Streaming over the landing zone.

One streaming query per output, each with its own checkpoint (``CHECKPOINT/<output>``). There is no
Spark watermark: every windowed or ordered output is an ``OrderedFold`` (``ordered.py``) whose key
carries its own event-time progress - a thermostat for rollups and the set-point log (its reading time),
a gateway for delivery latency (its messages' receive time), a gateway queue for queue counters (its
metrics' time). A key's window is written once that key's own latest time is ``--lateness`` past the
window's end; its rows that come later than that are dropped here and counted by the next batch run.
Copies of a message are reduced to the earliest received one before any window sees them. ``sla`` is a
join of two outputs (``delivery.sla``): join them when reading.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from pipeline.jobs import bronze, delivery, rollups, setpoints, telemetry
from pipeline.jobs.dedup import QUARANTINE_COLUMNS, REJECT_KEY, first_rejects_stream, reject_key
from pipeline.jobs.settings import JobSettings
from pipeline.jobs.source import StreamOptions, bad_lines, records
from pipeline.jobs.windows import parse_duration_ms
from pipeline.records import EVENTS, METRICS, QUARANTINE

#: The default stream options, one shared value (StreamOptions is frozen).
DEFAULT_OPTIONS = StreamOptions()

DAY_MS = 86_400_000


def build(spark: SparkSession, settings: JobSettings, options: StreamOptions) -> dict[str, DataFrame]:
    lateness_ms = parse_duration_ms(settings.lateness)
    remember_ms = max(settings.late_days * DAY_MS, lateness_ms)

    def rows(kind: str) -> DataFrame:
        return bronze.read(spark, settings.bronze_path, kind, stream=options)

    def readings() -> DataFrame:
        return telemetry.readings(telemetry.parse(records(rows(EVENTS))))

    every = bronze.read(spark, settings.bronze_path, stream=options)  # the quarantine query's: every kind
    rejected = [  # one row per rejected message, whichever micro-batch brings its copies
        telemetry.parse(records(every.where(F.col("kind") == EVENTS))).where("reason is not null").withColumns(
            {"stage": F.lit("telemetry"), REJECT_KEY: F.concat(F.lit("telemetry:"), F.col("message_id"))}),
        records(every.where(F.col("kind") == QUARANTINE)).withColumns(
            {"stage": F.lit("ingest"), REJECT_KEY: F.concat(F.lit("ingest:"), reject_key())}),
    ]
    columns = [*QUARANTINE_COLUMNS, REJECT_KEY, "landing_file", "sent_ms"]
    rejects = rejected[0].select(*columns).unionByName(rejected[1].select(*columns))
    unreadable = telemetry.as_quarantine(bad_lines(every), "landing")
    return {
        "rollups": rollups.rollups_stream(readings(), settings.window, lateness_ms),
        "setpoint_changes": setpoints.changes(readings(), lateness_ms),
        "delivery_latency": delivery.latency_stream(records(rows(EVENTS)), settings.window, lateness_ms, remember_ms),
        "queue_counters": delivery.queue_counters(
            delivery.queue_samples(records(rows(METRICS))), settings.window, lateness_ms
        ),
        "quarantine": first_rejects_stream(rejects, remember_ms).unionByName(unreadable),
    }


def start(spark: SparkSession, settings: JobSettings, checkpoint: str, options: StreamOptions = DEFAULT_OPTIONS,
          once: bool = False, trigger_seconds: float = 60.0) -> list[StreamingQuery]:
    """The output queries over the bronze table; unless ``once``, the compaction that feeds it runs beside
    them (``once``: ``run_stream`` compacts first)."""
    queries = [] if once else bronze.start_compaction(spark, settings.landing, settings.bronze_path, options,
                                                      once=False, trigger_seconds=trigger_seconds)
    for name, frame in build(spark, settings, options).items():
        writer = (
            frame.writeStream.queryName(name)
            .format("parquet")
            .outputMode("append")
            .partitionBy("date")
            .option("checkpointLocation", f"{checkpoint.rstrip('/')}/{name}")
        )
        writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=f"{trigger_seconds} seconds")
        queries.append(writer.start(settings.output(name)))
    return queries


def run_stream(spark: SparkSession, settings: JobSettings, checkpoint: str, options: StreamOptions = DEFAULT_OPTIONS,
               once: bool = False, trigger_seconds: float = 60.0, progress=print) -> None:
    """``once``: process what has landed and stop (``availableNow``); else run until a query fails."""
    if once:
        compacted = bronze.compact(spark, settings.landing, settings.bronze_path, options)
        progress(f"bronze: {compacted.input_rows} input rows in {compacted.micro_batches} micro-batches")
    queries = start(spark, settings, checkpoint, options, once, trigger_seconds)
    if once:
        for query in queries:
            query.awaitTermination()
            progress(f"{query.name}: {_input_rows(query)} input rows in {len(query.recentProgress)} micro-batches")
    else:
        progress("streaming " + ", ".join(query.name for query in queries) + "; Ctrl-C stops")
        spark.streams.awaitAnyTermination()


def _input_rows(query: StreamingQuery) -> int:
    return sum(progress.get("numInputRows", 0) or 0 for progress in query.recentProgress)
