"""The batch job: every output recomputed from the bronze table (and the HIL timelines, if given), after
compacting what has landed since the last run into it (``bronze.py``).

Batch has no watermark: late rows count in the window they belong to, so a batch run restates what the
streaming job dropped as too late. Outputs are partitioned by ``date``. A run over the whole zone
overwrites them; a run over receive dates (``JobSettings.received_from``/``received_to``) reads only the
landing partitions that can count there and replaces only the output partitions they can touch
(``JobSettings.output_dates``, dynamic partition overwrite), so its cost follows the days, not the history.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.jobs import bronze, delivery, firmware, hil, rollups, setpoints, telemetry
from pipeline.jobs.dedup import COPY_ORDER, CandidateKey, first_copies, first_rejects, hashed_key, mark_repeated_copies
from pipeline.jobs.output import PARTITIONS, WHOLE, commit_outputs, finish_commit, staging_folder, write_output
from pipeline.jobs.settings import JobSettings
from pipeline.jobs.source import bad_lines, read_hil, records
from pipeline.records import EVENTS, FIRMWARE, METRICS, QUARANTINE


def build(spark: SparkSession, settings: JobSettings, progress: Callable[[str], None] = lambda _: None
          ) -> dict[str, DataFrame]:
    """The output DataFrames, not yet written (the benchmark and the tests use this too), after compacting
    what has landed since the last run into the bronze table, which they read (unless
    ``settings.compact`` is false: something else keeps the table up to date).

    The events are read and deduplicated once for every output (``first_events``); what more than
    one output reads is cached: those events, and the latency and queue counters (``sla`` joins them).
    """
    if settings.compact:
        started = time.monotonic()
        compacted = bronze.compact(spark, settings.landing, settings.bronze_path)
        progress(f"[bronze] {compacted.input_rows} new landing lines -> {settings.bronze_path} "
                 f"in {time.monotonic() - started:.1f}s")
    progress(f"[range] {settings.covered()}")
    dates = settings.read_dates() if settings.ranged else None
    if settings.ranged:
        progress(f"[range] {describe_unseen(unseen_late(spark, settings), settings)}")
    lines = {kind: bronze.read(spark, settings.bronze_path, kind, dates=dates)
             for kind in (EVENTS, METRICS, QUARANTINE, FIRMWARE)}
    events = first_events(lines[EVENTS])
    readings = telemetry.readings(events.where(F.col(READING)), copy_order=False)
    ingest_rejects = first_rejects(records(lines[QUARANTINE]))
    update_statuses = first_copies(records(lines[FIRMWARE]))
    latency = delivery.latency(delivery.delivered(events.where(F.col(EVENT)), update_statuses),
                               settings.window).persist(StorageLevel.MEMORY_AND_DISK)
    counters = delivery.queue_counters(
        delivery.queue_samples(records(lines[METRICS])), settings.window
    ).persist(StorageLevel.MEMORY_AND_DISK)
    unreadable = [telemetry.as_quarantine(bad_lines(frame), "landing")
                  for frame in (events, lines[METRICS], lines[QUARANTINE], lines[FIRMWARE])]
    statuses = firmware.statuses(update_statuses,
                                 events.where(F.col(READING))).persist(StorageLevel.MEMORY_AND_DISK)
    outputs = {
        "rollups": rollups.rollups(readings, settings.window),
        "setpoint_changes": setpoints.changes(readings),
        "delivery_latency": latency,
        "queue_counters": counters,
        "sla": delivery.sla(latency, counters, settings.upstream_endpoint),
        "firmware": firmware.log(statuses),
        "firmware_updates": firmware.updates(statuses),
        "quarantine": functools.reduce(
            DataFrame.unionByName,
            [telemetry.as_quarantine(events.where(F.col(REJECT)), "telemetry"),
             telemetry.as_quarantine(ingest_rejects, "ingest"),
             telemetry.as_quarantine(firmware.rejects(update_statuses), "firmware"), *unreadable],
        ),
    }
    if settings.ranged:
        first, last = settings.output_dates()
        outputs = {name: frame.where(F.col("date").between(first, last)) for name, frame in outputs.items()}
    if settings.hil:
        timeline = read_hil(spark, settings.hil)
        outputs["hil_summary"] = hil.summary(timeline)
        outputs["hil_timeline"] = hil.timeline_per_second(timeline)
    return outputs


def unseen_late(spark: SparkSession, settings: JobSettings) -> dict[str, int | str | None]:
    """What a ranged run cannot count: readings and metrics samples received after its last read date
    whose own time falls in the output dates it rewrites. A full run (or one whose range covers their
    receive dates with a ``--late-days`` that reaches back to them) counts them; this one rewrites those
    partitions without them. Reads only the receive dates after the range: the days since, not history."""
    first, last = settings.output_dates()
    after = settings.read_dates()[-1]
    event_date = F.date_format(F.timestamp_millis("_event_ms"), "yyyy-MM-dd")
    readings = records(bronze.read(spark, settings.bronze_path, EVENTS)).where(
        (F.col("date") > after) & F.col("t_ts_ms").isNotNull() & F.col("reason").isNull()
    ).select(F.lit("readings").alias("_what"), F.col("t_ts_ms").alias("_event_ms"), "date")
    samples = records(bronze.read(spark, settings.bronze_path, METRICS)).where(F.col("date") > after).select(
        F.lit("metrics").alias("_what"), F.col(f"{bronze.METRICS_DOC}.ts_ms").alias("_event_ms"), "date")
    late = readings.unionByName(samples).where(event_date.between(first, last))
    found = late.agg(
        F.count(F.when(F.col("_what") == "readings", 1)).alias("readings"),
        F.count(F.when(F.col("_what") == "metrics", 1)).alias("metrics"),
        F.min("date").alias("earliest_receive_date"),
        F.max("date").alias("latest_receive_date"),
        F.max(F.datediff(F.to_date("date"), F.to_date(event_date))).alias("days_late"),
    ).first()
    assert found is not None
    return found.asDict()


def describe_unseen(unseen: dict, settings: JobSettings) -> str:
    after = settings.read_dates()[-1]
    if not unseen["readings"] and not unseen["metrics"]:
        return f"late data not seen: none (nothing received after {after} is about the rewritten dates)"
    return (f"late data not seen: {unseen['readings']} readings and {unseen['metrics']} metrics samples received "
            f"{unseen['earliest_receive_date']}..{unseen['latest_receive_date']} (after the dates read, which end "
            f"{after}) are about the rewritten dates; this run "
            f"rewrites them without those rows. A full run counts them, and so does this range with "
            f"--late-days {unseen['days_late']}.")


# Which deduplicated copy an event row is (``first_events``).
EVENT, READING, REJECT = "_first_event", "_first_reading", "_first_reject"
_REJECT_COLUMNS = ("topic", "payload", "payload_base64")
_READING_COLUMNS = ("t_temperature", "t_set_point", "t_heater", "t_ts_ms", "t_fw", "t_update")
COPY_ORDER_ONLY = tuple(name for name in COPY_ORDER if name != "received_ms")
_DROPPED_AFTER_DEDUP = tuple(name for name in COPY_ORDER_ONLY if name != "sent_ms")  # latency's clock offset reads sent_ms


def first_events(lines: DataFrame, candidate_key: CandidateKey = hashed_key) -> DataFrame:
    """The event rows of the bronze table (payloads parsed by compaction, ``telemetry.annotate``),
    deduplicated once for every output, cached.

    Three outputs deduplicate the events, each among its own rows (``dedup.first_copies``): delivery
    latency among all events, rollups and the change log among the valid readings, the quarantine among
    the telemetry rejects. ``mark_first_copies`` answers all three from one window by message id, and
    ``mark_repeated_copies`` sends to that window only the rows whose message id may have copies (about
    1 % at-least-once): the others are first copies already, and only their ``candidate_key`` (a hash of
    the id; injectable, so that a test can make every id collide) crosses a shuffle.

    What crosses the shuffle and what the cache keeps are the columns some output reads, no more (the
    shuffle, the sort and building the cache cost per byte): the raw ``topic`` / ``payload`` only on the
    rows the quarantine takes (a reading's is never read again), the copy order's ``landing_file`` and
    ``sent_ms`` (the copy order; ``sent_ms`` also the latency's clock offset) only as far as they are read, no
    ``received_at`` (a function of ``received_ms``).
    """
    record = F.col("landing_error").isNull()
    telemetry_row = record & (F.col("output") == telemetry.TELEMETRY_OUTPUT)
    reading, reject = telemetry_row & F.col("reason").isNull(), telemetry_row & F.col("reason").isNotNull()
    quarantined = reject | ~record
    slim = lines.select(
        "message_id", "gateway_id", "device_id", "priority", "enqueued_ms", "received_ms", *COPY_ORDER_ONLY,
        "landing_error", F.when(quarantined, F.col("reason")).alias("reason"), *_READING_COLUMNS,
        *[F.when(quarantined, F.col(name)).alias(name) for name in _REJECT_COLUMNS],
        F.coalesce(reading, F.lit(False)).alias(READING), F.coalesce(reject, F.lit(False)).alias(REJECT),
    )
    marked = mark_repeated_copies(slim, {EVENT: record, READING: F.col(READING), REJECT: F.col(REJECT)}, record,
                                  candidate_key=candidate_key)
    kept = marked.where(F.col(EVENT) | F.col(READING) | F.col(REJECT) | ~record).drop(*_DROPPED_AFTER_DEDUP)
    return kept.persist(StorageLevel.MEMORY_AND_DISK)


#: How many outputs are written at once. Spark runs the jobs of several threads side by side: while one
#: output's job is in a stage of one task (an aggregate coalesced to one partition, the write of a small
#: output) or in the driver (planning, committing and listing its files), another's tasks use the idle
#: core. Tasks still run at most one per core (the scheduler's slots), so memory is as for one output.
CONCURRENT_WRITES = 3


def run_batch(spark: SparkSession, settings: JobSettings, progress: Callable[[str], None] = print) -> dict[str, int]:
    """Write every output (compaction first, see ``build``); returns the row count of each. The outputs
    are staged, ``CONCURRENT_WRITES`` at a time, then moved into place together (``output.commit_outputs``):
    a run that fails changes none of them."""
    if finish_commit(spark, settings.out):
        progress(f"[commit] completed the interrupted commit of an earlier run in {settings.out}")
    outputs = build(spark, settings, progress)
    staging = staging_folder(settings.out)

    def write(number: int, name: str, frame: DataFrame) -> int:
        started = time.monotonic()
        progress(f"[{number}/{len(outputs)}] {name} -> {settings.output(name)} (staged)")
        rows = write_output(spark, frame, f"{staging}/{name}")
        progress(f"[{number}/{len(outputs)}] {name}: {rows} rows in {time.monotonic() - started:.1f}s")
        return rows

    try:
        with ThreadPoolExecutor(CONCURRENT_WRITES, thread_name_prefix="output") as pool:
            futures = {name: pool.submit(write, number, name, frame)
                       for number, (name, frame) in enumerate(outputs.items(), start=1)}
            try:
                counts = {name: future.result() for name, future in futures.items()}
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # the outputs not started yet are not written
                raise
    except BaseException:
        finish_commit(spark, settings.out)  # no journal: removes the staged outputs, the old ones stay
        raise
    finally:
        spark.catalog.clearCache()
    modes = {name: PARTITIONS if settings.ranged and "date" in frame.columns else WHOLE
             for name, frame in outputs.items()}
    commit_outputs(spark, settings.out, staging, modes)
    progress(f"[commit] {len(outputs)} outputs in place")
    return counts
