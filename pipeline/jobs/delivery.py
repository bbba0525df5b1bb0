"""Delivery SLA per gateway and priority: end-to-end latency from the messages, queue outcomes from the
gateway's metrics messages, over tumbling windows aligned to the Unix epoch.

* ``latency``: latency = cloud receive time - ``gw-enqueued-ms`` (first copy of each message), bucketed by
  receive time, so a backlog flushed after an outage shows up when it arrives rather than being dropped
  as late. p50/p95/p99 are exact: the latency at rank ceil(q * n) of the window's n. The two times are
  on two clocks (the ingest's, the gateway's), so each window also gets the gateway's **clock offset**
  as seen from the cloud: ``clock_offset_ms``, the lower envelope (minimum) of receive time - ``gw-sent-ms``
  over its messages, which is the cloud clock minus the gateway's plus the fastest transit. A negative
  one is impossible on agreeing clocks (the gateway's is ahead, and its latencies read negative), one
  above ``CLOCK_TOLERANCE_MS`` is no transit time of a live link; such a window has ``clock_suspect``
  true, and ``corrected`` (the report) subtracts the offset from its latencies.
* ``queue_counters``: the metrics' ``sent``/``expired``/``dropped``/``retries``/``dead_lettered`` are read as counters that
  only grow while the gateway runs (its restart resets them to zero), so a window gets the increase over
  the samples in it: a counter below the previous sample is a reset and counts from zero, the first sample
  seen counts from zero, and a repeated sample adds nothing. "Previous" is in the gateway's own order, not
  its clock: a document's ``boot_id`` and ``seq`` (boots in the order the cloud first received them, then
  the sequence); a new boot counts from zero (why not the ``ts_ms`` order: docs/pipeline.md). Documents of
  older gateways (no boot id) keep the ``ts_ms`` order, as one boot. The window is the one of the cloud's
  receive time, as latency's: the gateway publishes its metrics directly (never queued), so they arrive
  as they are sent, and its clock, stepped or skewed, places nothing (in ``ts_ms`` windows a step back
  put samples in windows streaming had closed). ``depth`` and ``oldest_age_s`` are gauges:
  the window keeps their maximum. An ``OrderedFold`` over (gateway, endpoint, priority), window by window.
* ``sla``: the two joined on (gateway, priority, window) for the upstream endpoint.
"""

from __future__ import annotations

import math

import pandas as pd
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.jobs.bronze import METRICS_DOC
from pipeline.jobs.ordered import OrderedFold, StreamTiming
from pipeline.jobs.schemas import COUNTERS, DELIVERY_LATENCY_OUTPUT, QUEUE_COUNTERS_OUTPUT
from pipeline.jobs.windows import parse_duration_ms, window_columns, window_start_ms

# The gateway's own order of its metrics documents: boot ("" for gateways that send none) and sequence
# (ts_ms for those), boots ordered by their first receipt (the cloud's clock).
BOOT, SEQ = "boot", "seq"
_KEPT_BOOTS = 16  # a queue's state remembers the first receipt of its latest boots
GAUGES = ("depth", "oldest_age_s")


QUANTILES = (0.5, 0.95, 0.99)
PERCENTILES = ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms")  # their columns
# The fastest transit from a gateway's send to the cloud's receipt in a window stays under this on agreeing
# clocks (a PUBLISH over a slow uplink takes seconds, not a minute); beyond it, or below zero, the offset is
# the gateway's clock, not the network.
CLOCK_TOLERANCE_MS = 60_000


def clock_suspect(offset: str = "clock_offset_ms"):
    return ((F.col(offset) < 0) | (F.col(offset) > CLOCK_TOLERANCE_MS)).alias("clock_suspect")


# What latency reads of a delivered message.
DELIVERED = ("gateway_id", "priority", "received_ms", "enqueued_ms", "sent_ms")


def delivered(events: DataFrame, update_statuses: DataFrame) -> DataFrame:
    """Every message a gateway delivered, for latency: the events and the thermostats' update status
    messages (the ``firmware`` kind since it has its own output; they crossed the same queues and link, and
    an SLA that left them out undercounted every window of an update). A message is of one kind in all
    its copies, so the two sets share no id; ``streaming`` frames keep the copy order's columns."""
    columns = [*DELIVERED, *(c for c in ("message_id", "landing_file") if c in events.columns)]
    return events.select(*columns).unionByName(update_statuses.select(*columns))


def latency(events: DataFrame, window: str) -> DataFrame:
    """``events`` deduplicated (batch; streaming: ``latency_stream``).

    The percentiles are exact, by ``latency_step``'s rule (DuckDB's ``quantile_disc``): each window's
    latencies collected and sorted, the one at rank ceil(q * n) taken. ``percentile_approx`` at accuracy
    10000 gave the same below 10,000 messages per window, a neighbour of it above, and cost more: its
    digests are built, serialised and merged per window and task."""
    window_ms = parse_duration_ms(window)
    measured = events.select(
        window_start_ms("received_ms", window_ms).alias("window_start_ms"), "gateway_id", "priority",
        (F.col("received_ms") - F.col("enqueued_ms")).alias("latency_ms"),
        (F.col("received_ms") - F.col("sent_ms")).alias("_transit_ms"),
    )
    ordered = F.col("_latencies")
    computed = (
        measured.groupBy("window_start_ms", "gateway_id", "priority")
        .agg(F.count(F.lit(1)).alias("delivered"), F.array_sort(F.collect_list("latency_ms")).alias("_latencies"),
             F.max("latency_ms").alias("latency_max_ms"), F.min("_transit_ms").alias("clock_offset_ms"))
        .withColumns({
            name: F.try_element_at(ordered, F.greatest(F.ceil(F.lit(q) * F.size(ordered)), F.lit(1)).cast("int"))
            for q, name in zip(QUANTILES, PERCENTILES, strict=True)
        })
    )
    return latency_written(computed, window_ms)


def latency_written(computed: DataFrame, window_ms: int) -> DataFrame:
    """The ``DELIVERY_LATENCY_OUTPUT`` columns (batch's aggregate, streaming's fold) as the output writes them."""
    start, end, date = window_columns("window_start_ms", window_ms)
    return DELIVERY_LATENCY_OUTPUT.select(
        computed, {"window_start": start, "window_end": end, "clock_suspect": clock_suspect(), "date": date})


def latency_step(window_ms: int):
    """``latency``'s aggregate over one gateway's (deduplicated) messages. The quantile is the smallest
    latency with at least that share of the window's latencies at or below it, as in batch."""

    def step(key: tuple, last: dict | None, rows: pd.DataFrame) -> tuple[pd.DataFrame, dict | None]:
        measured = pd.DataFrame({
            "priority": rows["priority"],
            "window_start_ms": rows["received_ms"] - rows["received_ms"] % window_ms,
            "latency_ms": rows["received_ms"] - rows["enqueued_ms"],
            "transit_ms": rows["received_ms"] - rows["sent_ms"],
        })
        out = []
        for (priority, start), group in measured.groupby(["priority", "window_start_ms"], sort=True):
            values = group["latency_ms"].sort_values().to_numpy()
            ranks = [max(math.ceil(q * len(values)), 1) - 1 for q in QUANTILES]
            out.append({
                "gateway_id": key[0], "priority": priority, "window_start_ms": start, "delivered": len(values),
                **{name: int(values[rank]) for name, rank in zip(PERCENTILES, ranks, strict=True)},
                "latency_max_ms": int(values[-1]), "clock_offset_ms": int(group["transit_ms"].min()),
            })
        return pd.DataFrame(out, columns=DELIVERY_LATENCY_OUTPUT.names), None

    return step


def latency_stream(events: DataFrame, window: str, timing: StreamTiming | int, remember_ms: int) -> DataFrame:
    """``latency`` in streaming: each gateway's messages closed by its own receive times, copies dropped
    (a redelivery up to ``remember_ms`` after the first copy too)."""
    window_ms = parse_duration_ms(window)
    fold = OrderedFold(
        keys=("gateway_id",), time_ms="received_ms", columns=("received_ms", "priority", "enqueued_ms", "sent_ms"),
        output=DELIVERY_LATENCY_OUTPUT.ddl, step=latency_step(window_ms),
        ready_at=lambda times: times - times % window_ms + window_ms, dedup=True, remember_ms=remember_ms,
    )
    return latency_written(fold.stream(events.where(F.col("gateway_id").isNotNull()), timing), window_ms)


def queue_samples(metrics: DataFrame) -> DataFrame:
    """One row per metrics message, endpoint and priority (bronze rows: the payload is parsed already)."""
    doc = metrics.select(F.col(METRICS_DOC).alias("m"), "received_ms").where(F.col("m.ts_ms").isNotNull())
    per_endpoint = doc.select("m.gateway_id", "m.ts_ms", "received_ms",
                              F.coalesce("m.boot_id", F.lit("")).alias(BOOT),
                              F.coalesce("m.seq", "m.ts_ms").alias(SEQ),
                              F.explode("m.endpoints").alias("endpoint", "queues"))
    per_queue = per_endpoint.select(
        "gateway_id", "ts_ms", "received_ms", BOOT, SEQ, "endpoint", F.explode("queues").alias("priority", "q")
    )
    return per_queue.select(
        "gateway_id", "endpoint", F.col("priority").cast("int").alias("priority"),
        F.col("ts_ms").alias("sample_ms"), F.timestamp_millis("ts_ms").alias("sample_at"), "received_ms", BOOT, SEQ,
        *[F.col(f"q.{name}").alias(name) for name in COUNTERS + GAUGES],
    )


def in_gateway_order(rows: pd.DataFrame, boots: dict[str, int]) -> pd.DataFrame:
    """``rows`` (one queue's samples) in the gateway's order - boot by first receipt (``boots`` holds the
    earlier ones, and is updated), then sequence - with a repeated (boot, sequence) dropped; the same order
    and tie-break (the values, then the receipt: of a document's copies the earliest received is the one
    counted, in its window) as the batch SQL."""
    for boot, first in rows.groupby(BOOT)["received_ms"].min().items():
        boots[boot] = min(int(first), boots.get(boot, int(first)))
    ranked = rows.assign(_rank=rows[BOOT].map(boots))
    order = ["_rank", BOOT, SEQ, *COUNTERS, *GAUGES, "received_ms"]
    ranked = ranked.sort_values(order, kind="stable", na_position="last")
    return ranked.drop_duplicates([BOOT, SEQ], keep="first").drop(columns="_rank").reset_index(drop=True)


def counter_step(window_ms: int):
    def step(key: tuple, last: dict | None, rows: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
        boots = dict((last or {}).get("_boots", {}))
        rows = in_gateway_order(rows, boots)
        if last and "_seq" in last:  # a copy of a document stepped before (a redelivery in a later window)
            rows = rows[~((rows[BOOT] == last["_boot"]) & (rows[SEQ] <= last["_seq"]))].reset_index(drop=True)
            if rows.empty:
                return pd.DataFrame(columns=QUEUE_COUNTERS_OUTPUT.names), last
        same_boot = rows[BOOT].eq(rows[BOOT].shift(1, fill_value=(last or {}).get("_boot")))
        increases = {}
        for name in COUNTERS:
            values = rows[name].fillna(0).astype("int64")
            before = values.shift(1, fill_value=last[name] if last else 0).where(same_boot, 0)  # a new boot: zero
            increases[name] = values.where(values < before, values - before)  # below before: a reset
        frame = pd.DataFrame(increases)
        frame["window_start_ms"] = rows["received_ms"] - rows["received_ms"] % window_ms
        frame["depth"], frame["oldest_age_s"] = rows["depth"], rows["oldest_age_s"]
        grouped = frame.groupby("window_start_ms", sort=True)
        out = grouped[list(COUNTERS)].sum()
        out["samples"] = grouped.size()
        out["depth_max"] = grouped["depth"].max()
        out["oldest_age_s_max"] = grouped["oldest_age_s"].max()
        out = out.reset_index()
        out["window_end_ms"] = out["window_start_ms"] + window_ms
        out["gateway_id"], out["endpoint"], out["priority"] = key
        tail = rows.iloc[-1]
        remembered = {name: int(0 if pd.isna(tail[name]) else tail[name]) for name in COUNTERS}
        latest = sorted(boots.items(), key=lambda item: item[1])[-_KEPT_BOOTS:]
        return out[QUEUE_COUNTERS_OUTPUT.names], {**remembered, "_boot": str(tail[BOOT]), "_seq": int(tail[SEQ]), "_boots": dict(latest)}

    return step


def counters_fold(window_ms: int) -> OrderedFold:
    return OrderedFold(
        keys=("gateway_id", "endpoint", "priority"),
        time_ms="received_ms",  # the window's clock: the cloud's (see queue_samples)
        columns=("received_ms", "sample_ms", *COUNTERS, *GAUGES, BOOT, SEQ),
        output=QUEUE_COUNTERS_OUTPUT.ddl,
        step=counter_step(window_ms),
        ready_at=lambda times: times - times % window_ms + window_ms,  # a window is stepped once it is closed
    )


def queue_counters(samples: DataFrame, window: str, timing: StreamTiming | int | None = None) -> DataFrame:
    """``timing``: streaming (each queue closed by its own samples' progress); None: batch."""
    window_ms = parse_duration_ms(window)
    if timing is not None:
        folded = counters_fold(window_ms).stream(samples, timing)
    else:
        folded = _queue_counters_batch(samples, window_ms)
    start, end, date = window_columns("window_start_ms", window_ms)
    return QUEUE_COUNTERS_OUTPUT.select(folded, {"window_start": start, "window_end": end, "date": date})


def _queue_counters_batch(samples: DataFrame, window_ms: int) -> DataFrame:
    """``counter_step`` in Spark SQL, in the JVM (no Python worker on the batch path): each queue's samples in
    the order the step sorts them (``in_gateway_order``: boot by first receipt, sequence, then the values,
    then the receipt), a repeated (boot, sequence) dropped (a redelivered copy: the earliest received
    counts, in its window; the order was left to the shuffle, and a copy 90 s later moved the sample
    into the next window in one run and not in another), the increase of each counter over the previous sample of the same
    boot by ``lag`` (a new boot counts from zero), summed per window."""
    queue = ("gateway_id", "endpoint", "priority")
    ranked = samples.withColumn("_rank", F.min("received_ms").over(Window.partitionBy(*queue, BOOT)))
    order = Window.partitionBy(*queue).orderBy(
        "_rank", BOOT, SEQ, *[F.col(name).asc_nulls_last() for name in (*COUNTERS, *GAUGES)], "received_ms"
    )
    repeated = (F.lag(BOOT).over(order) == F.col(BOOT)) & (F.lag(SEQ).over(order) == F.col(SEQ))
    first_of_time = ranked.withColumn("_repeat", F.coalesce(repeated, F.lit(False))).where(~F.col("_repeat"))
    increases = {}
    for name in COUNTERS:
        value = F.coalesce(F.col(name), F.lit(0))
        before = F.when(F.lag(BOOT).over(order) == F.col(BOOT), F.coalesce(F.lag(value).over(order), F.lit(0))
                        ).otherwise(F.lit(0))
        increases[f"_{name}"] = F.when(value < before, value).otherwise(value - before)  # below before: a reset
    stepped = first_of_time.withColumns(
        {**increases, "_window_start_ms": window_start_ms("received_ms", window_ms)}
    )
    return stepped.groupBy(*queue, F.col("_window_start_ms").alias("window_start_ms")).agg(
        F.count(F.lit(1)).alias("samples"),
        *[F.sum(f"_{name}").alias(name) for name in COUNTERS],
        F.max("depth").alias("depth_max"),
        F.max("oldest_age_s").alias("oldest_age_s_max"),
    ).withColumn("window_end_ms", F.col("window_start_ms") + window_ms).select(*QUEUE_COUNTERS_OUTPUT.names)


def sla(latency_rows: DataFrame, counter_rows: DataFrame, upstream_endpoint: str = "upstream") -> DataFrame:
    """Latency and queue outcomes side by side; a window with only one of the two has nulls for the other."""
    queues = counter_rows.where(F.col("endpoint") == upstream_endpoint).select(
        "gateway_id", "priority", "window_start", "window_end",
        *[F.col(name).alias(f"queue_{name}") for name in COUNTERS],
        "depth_max", "oldest_age_s_max",
    )
    joined = latency_rows.drop("date").join(queues, ["gateway_id", "priority", "window_start", "window_end"], "full")
    return joined.withColumn("date", F.date_format("window_start", "yyyy-MM-dd"))
