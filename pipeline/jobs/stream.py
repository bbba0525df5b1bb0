"""The incremental job: the same outputs as batch (HIL and the joined ``sla`` aside), with Structured
Streaming over the landing zone.

One streaming query per output, each with its own checkpoint (``CHECKPOINT/<output>``) and its own
event-time watermark: reading time for rollups and set points, receive time for delivery latency and the
quarantine, the gateway's sample time for queue counters. A window is written once the watermark has
passed its end (append mode), so results trail the data by the window plus the lateness; rows later than
that are dropped here and counted by the next batch run. ``sla`` is a join of two outputs
(``delivery.sla``): join them when reading.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipeline.records import EVENTS, METRICS, QUARANTINE
from pipeline.jobs import delivery, rollups, setpoints, telemetry
from pipeline.jobs.dedup import first_copies, first_rejects
from pipeline.jobs.settings import JobSettings
from pipeline.jobs.source import StreamOptions, read_landing, records

def build(spark: SparkSession, settings: JobSettings, options: StreamOptions) -> dict[str, DataFrame]:
    def events() -> DataFrame:
        return records(read_landing(spark, settings.landing, EVENTS, options))

    def readings() -> DataFrame:
        parsed = telemetry.parse(events())
        return first_copies(telemetry.readings(parsed), "reading_at", settings.lateness, streaming=True)

    parsed = telemetry.parse(events())
    rejects = first_copies(parsed.where("reason is not null"), "received_at", settings.lateness, streaming=True)
    samples = delivery.queue_samples(records(read_landing(spark, settings.landing, METRICS, options)))
    ingest_rejects = read_landing(spark, settings.landing, QUARANTINE, options)
    return {
        "rollups": rollups.rollups(readings(), settings.window),
        "setpoint_changes": setpoints.changes(readings(), streaming=True),
        "delivery_latency": delivery.latency(
            first_copies(events(), "received_at", settings.lateness, streaming=True), settings.window
        ),
        "queue_counters": delivery.queue_counters(
            samples.withWatermark("sample_at", settings.lateness), settings.window, streaming=True
        ),
        "quarantine": telemetry.as_quarantine(rejects, "telemetry").unionByName(
            telemetry.as_quarantine(first_rejects(records(ingest_rejects), settings.lateness, streaming=True), "ingest")
        ),
    }


def start(spark: SparkSession, settings: JobSettings, checkpoint: str, options: StreamOptions = StreamOptions(),
          once: bool = False, trigger_seconds: float = 60.0) -> list[StreamingQuery]:
    queries = []
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


def run_stream(spark: SparkSession, settings: JobSettings, checkpoint: str, options: StreamOptions = StreamOptions(),
               once: bool = False, trigger_seconds: float = 60.0, progress=print) -> None:
    """``once``: process what has landed and stop (``availableNow``); else run until a query fails."""
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
