"""The incremental job: the same outputs as batch (HIL and the joined ``sla`` aside), with Structured
Streaming over the landing zone.

One streaming query per output, each with its own checkpoint (``CHECKPOINT/<output>``). Every windowed
or ordered output is an ``OrderedFold`` (``ordered.py``) whose key carries its own event-time progress -
a thermostat for rollups and the set-point log (its reading time), a gateway for delivery latency (its
messages' receive time), a gateway queue for queue counters (its metrics' receive time) - moved only by rows
that are behind the receive horizon (the query's watermark on the cloud receive time, and the oldest
landing file still being written: ``open_since``), so any number of ingest writers and files sealed late
lose nothing. A key's window is written once that key's own admitted time is ``--lateness`` past the
window's end, or once the key has been silent for ``--idle-timeout`` of receive time; its rows that come
later than that are dropped here and counted by the next batch run.

A run is ``--once`` (``availableNow``); without it, ``run_stream`` repeats such a run every
``--trigger-seconds``: the open landing files are listed before each run, which a query started once and
left running could not do.
Copies of a message are reduced to the earliest received one before any window sees them. ``sla`` is a
join of two outputs (``delivery.sla``): join them when reading.
"""

from __future__ import annotations

import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from pipeline.jobs import bronze, delivery, firmware, rollups, setpoints, telemetry
from pipeline.jobs.dedup import REJECT_KEY, reject_key
from pipeline.jobs.files import HadoopFiles, name_of
from pipeline.jobs.ordered import StreamTiming, first_rejects_stream, kept_after_watermark, receive_watermarked
from pipeline.jobs.schemas import QUARANTINE_OUTPUT
from pipeline.jobs.settings import JobSettings
from pipeline.jobs.source import StreamOptions, bad_lines, records
from pipeline.jobs.windows import parse_duration_ms
from pipeline.landing import INPROGRESS_SUFFIX, opened_ms_of
from pipeline.records import EVENTS, FIRMWARE, KINDS, METRICS, QUARANTINE

#: The default stream options, one shared value (StreamOptions is frozen).
DEFAULT_OPTIONS = StreamOptions()

DAY_MS = 86_400_000


# A message is written to its landing file within the ingest's --max-delay-ms (50) of its receipt, so
# before the file's opening time by at most that; the margin also covers the ingest's clock against
# itself across a file open (NTP slews).
OPEN_FILE_MARGIN_MS = 10_000


def open_since(spark: SparkSession, landing: str) -> int | None:
    """The receive horizon the landing zone's open files allow: the opening time of the oldest file still
    being written (``.part-*.jsonl.inprogress``, a live writer's or a crashed one's) less a margin; None when
    every file is sealed. Listed through Hadoop's FileSystem, names only."""
    files = HadoopFiles(spark)
    opened = []
    for kind in KINDS:
        for path in files.glob(f"{str(landing).rstrip('/')}/{kind}/date=*/hour=*/.part-*{INPROGRESS_SUFFIX}"):
            at = opened_ms_of(name_of(path))
            if at is not None:
                opened.append(at)
    return min(opened) - OPEN_FILE_MARGIN_MS if opened else None


def timing_of(settings: JobSettings, open_since_ms: int | None) -> StreamTiming:
    idle = None if settings.idle_timeout is None else parse_duration_ms(settings.idle_timeout)
    return StreamTiming(parse_duration_ms(settings.lateness), idle, open_since_ms)


def build(spark: SparkSession, settings: JobSettings, options: StreamOptions,
          timing: StreamTiming | None = None) -> dict[str, DataFrame]:
    """The output queries' frames; ``timing`` (default: from ``settings``, no open files) says what
    closes a key's windows."""
    timing = timing or timing_of(settings, None)
    lateness_ms = timing.lateness_ms
    remember_ms = max(settings.late_days * DAY_MS, lateness_ms)

    def rows(kind: str) -> DataFrame:
        return bronze.read(spark, settings.bronze_path, kind, stream=options)

    def readings() -> DataFrame:
        return telemetry.readings(telemetry.parse(records(rows(EVENTS))))

    # the quarantine query's: every kind, every row moving the receive horizon its rejects wait for
    every = receive_watermarked(bronze.read(spark, settings.bronze_path, stream=options), timing)
    record, kind = F.col("landing_error").isNull(), F.col("kind")
    stage = (  # one row per rejected message, whichever micro-batch brings its copies
        F.when(record & (kind == EVENTS) & (F.col("output") == telemetry.TELEMETRY_OUTPUT) & F.col("reason").isNotNull(),
               F.lit("telemetry"))
        .when(record & (kind == QUARANTINE), F.lit("ingest"))
        .when(record & (kind == FIRMWARE) & firmware.reject_reason().isNotNull(), F.lit("firmware")))
    staged = every.withColumns({
        "stage": stage,
        "reason": F.when(stage == "firmware", firmware.reject_reason()).otherwise(F.col("reason")),
        REJECT_KEY: F.concat(stage, F.lit(":"), F.when(stage == "ingest", reject_key()).otherwise(F.col("message_id"))),
    })
    columns = [*QUARANTINE_OUTPUT.names, REJECT_KEY, "landing_file", "sent_ms"]
    rejects = kept_after_watermark(staged, F.col("stage").isNotNull()).select(*columns)
    unreadable = telemetry.as_quarantine(bad_lines(every), "landing")
    return {
        "rollups": rollups.rollups_stream(readings(), settings.window, timing),
        "setpoint_changes": setpoints.changes(readings(), timing),
        "delivery_latency": delivery.latency_stream(delivery.delivered(records(rows(EVENTS)), records(rows(FIRMWARE))),
                                                    settings.window, timing, remember_ms),
        "queue_counters": delivery.queue_counters(
            delivery.queue_samples(records(rows(METRICS))), settings.window, timing
        ),
        "quarantine": rejects_written(first_rejects_stream(rejects, timing, remember_ms, REJECT_KEY, QUARANTINE_OUTPUT)
                                      ).unionByName(unreadable),
    }


def rejects_written(folded: DataFrame) -> DataFrame:
    """The reject fold's rows as the quarantine output writes them (no gateway: null, as in batch)."""
    at = F.timestamp_millis("received_ms")
    return QUARANTINE_OUTPUT.select(folded, {"gateway_id": F.when(F.col("gateway_id") != "", F.col("gateway_id")),
                                             "received_at": at, "date": F.date_format(at, "yyyy-MM-dd")})


def start(spark: SparkSession, settings: JobSettings, checkpoint: str, options: StreamOptions = DEFAULT_OPTIONS,
          timing: StreamTiming | None = None) -> list[StreamingQuery]:
    """The output queries over the bronze table, ``availableNow``: what is committed there, then stop."""
    queries = []
    for name, frame in build(spark, settings, options, timing).items():
        writer = (
            frame.writeStream.queryName(name)
            .format("parquet")
            .outputMode("append")
            .partitionBy("date")
            .option("checkpointLocation", f"{checkpoint.rstrip('/')}/{name}")
            .trigger(availableNow=True)
        )
        queries.append(writer.start(settings.output(name)))
    return queries


def run_once(spark: SparkSession, settings: JobSettings, checkpoint: str, options: StreamOptions = DEFAULT_OPTIONS,
             progress=print) -> None:
    """List the open landing files, compact what is sealed, then run every output over it and stop. The
    listing comes first: a file sealed between the two is compacted and read, one opened after it holds
    only rows received after it."""
    open_since_ms = open_since(spark, settings.landing)
    compacted = bronze.compact(spark, settings.landing, settings.bronze_path, options)
    progress(f"bronze: {compacted.input_rows} input rows in {compacted.micro_batches} micro-batches")
    if open_since_ms is not None:
        progress(f"open landing files: rows received after {open_since_ms} ms wait for them to be sealed")
    for query in start(spark, settings, checkpoint, options, timing_of(settings, open_since_ms)):
        query.awaitTermination()
        progress(f"{query.name}: {_input_rows(query)} input rows in {len(query.recentProgress)} micro-batches")


def run_stream(spark: SparkSession, settings: JobSettings, checkpoint: str, options: StreamOptions = DEFAULT_OPTIONS,
               once: bool = False, trigger_seconds: float = 60.0, progress=print, runs: int | None = None) -> None:
    """``once``: process what has landed and stop; else a ``run_once`` every ``trigger_seconds`` (or
    ``runs`` times) until interrupted."""
    if once:
        run_once(spark, settings, checkpoint, options, progress)
        return
    progress(f"streaming: a run every {trigger_seconds:g} s; Ctrl-C stops")
    done = 0
    while runs is None or done < runs:
        started = time.monotonic()
        run_once(spark, settings, checkpoint, options, progress)
        done += 1
        if runs is None or done < runs:
            time.sleep(max(0.0, trigger_seconds - (time.monotonic() - started)))


def _input_rows(query: StreamingQuery) -> int:
    return sum(progress.get("numInputRows", 0) or 0 for progress in query.recentProgress)
