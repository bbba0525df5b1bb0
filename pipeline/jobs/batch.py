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

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.jobs import bronze, delivery, hil, rollups, setpoints, telemetry
from pipeline.jobs.dedup import first_copies, first_rejects
from pipeline.jobs.output import write_output
from pipeline.jobs.settings import JobSettings
from pipeline.jobs.source import bad_lines, read_hil, records
from pipeline.records import EVENTS, METRICS, QUARANTINE


def build(spark: SparkSession, settings: JobSettings, progress: Callable[[str], None] = lambda _: None
          ) -> dict[str, DataFrame]:
    """The output DataFrames, not yet written (the benchmark and the tests use this too), after compacting
    what has landed since the last run into the bronze table, which they read (unless
    ``settings.compact`` is false: something else keeps the table up to date).

    The deduplicated readings feed two outputs and cost a shuffle to get there, so they are cached (a few
    numeric columns; ``run_batch`` drops the cache when done).
    """
    if settings.compact:
        started = time.monotonic()
        compacted = bronze.compact(spark, settings.landing, settings.bronze_path)
        progress(f"[bronze] {compacted.input_rows} new landing lines -> {settings.bronze_path} "
                 f"in {time.monotonic() - started:.1f}s")
    dates = settings.read_dates() if settings.ranged else None
    lines = {kind: bronze.read(spark, settings.bronze_path, kind, dates=dates) for kind in (EVENTS, METRICS, QUARANTINE)}
    events = records(lines[EVENTS])
    parsed = telemetry.parse(events)
    readings = first_copies(telemetry.readings(parsed))
    readings = readings.persist(StorageLevel.MEMORY_AND_DISK)
    rejects = first_copies(parsed.where("reason is not null"))
    ingest_rejects = first_rejects(records(lines[QUARANTINE]))
    latency = delivery.latency(first_copies(events), settings.window)
    counters = delivery.queue_counters(
        delivery.queue_samples(records(lines[METRICS])), settings.window
    )
    unreadable = [telemetry.as_quarantine(bad_lines(frame), "landing") for frame in lines.values()]
    outputs = {
        "rollups": rollups.rollups(readings, settings.window),
        "setpoint_changes": setpoints.changes(readings),
        "delivery_latency": latency,
        "queue_counters": counters,
        "sla": delivery.sla(latency, counters, settings.upstream_endpoint),
        "quarantine": functools.reduce(
            DataFrame.unionByName,
            [telemetry.as_quarantine(rejects, "telemetry"), telemetry.as_quarantine(ingest_rejects, "ingest"),
             *unreadable],
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


def run_batch(spark: SparkSession, settings: JobSettings, progress: Callable[[str], None] = print) -> dict[str, int]:
    """Write every output (compaction first, see ``build``); returns the row count of each."""
    outputs = build(spark, settings, progress)
    counts = {}
    for number, (name, frame) in enumerate(outputs.items(), start=1):
        started = time.monotonic()
        progress(f"[{number}/{len(outputs)}] {name} -> {settings.output(name)}")
        counts[name] = write_output(spark, frame, settings.output(name), dynamic=settings.ranged)
        progress(f"[{number}/{len(outputs)}] {name}: {counts[name]} rows in {time.monotonic() - started:.1f}s")
    spark.catalog.clearCache()
    return counts
