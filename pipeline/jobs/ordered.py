"""Per-key computations that need a key's rows in time order in Structured Streaming, with the event-time
progress of each key on its own, judged only on rows the stream can no longer be missing.

A computation is written once as a pandas ``step(key, last, rows) -> (output, last)``: ``rows`` are one
key's rows in time order, ``last`` is what the step remembered from the rows before them. Batch computes
the same columns in Spark SQL (window functions, ``lag``: no Python worker on its path, a pandas call per
key cost several times more), and the tests hold each pair equal (tests/pipeline/test_batch_plan.py for
the queue counters, test_stream*.py for streaming against batch).

Streaming calls it through ``applyInPandasWithState``, and the key's state carries its own clock: the
latest event time of the key's *admitted* rows (``progress``). A row may be stepped once ``progress -
lateness`` has reached its ``ready_at`` (for a window: the window's end); until then it waits in the
state. A row that arrives when its ``ready_at`` is already behind ``progress - lateness`` - its window was
closed and written - is late and dropped. Spark's own watermark is one for the whole query, so one
gateway's on-time data would make another's backlog late; here a gateway draining a day-old backlog is judged
by its own times only.

**Admission: the receive horizon.** Several ingest processes land one gateway's messages, each into its
own files, sealed up to a minute apart (or, after a crash, when the process is back). A key's progress
taken from one writer's file would make the same key's rows in another writer's later file late (a
drained backlog would lose half its readings). So a row moves its key's progress only once the stream can no longer
be missing rows received before it: its cloud receive time (``received_ms``, the ingest's clock) is at or
behind the **receive horizon**, the lower of

* the query's watermark on ``received_ms`` (Spark's, one per query, kept in the checkpoint): the newest
  receive time seen in any row, of any key and any writer, minus ``lateness``. A file sealed up to
  ``lateness`` after the newest data (``--roll-seconds``, a quick restart) is still in time;
* ``open_since_ms``: the opening time of the oldest landing file still being written (``.inprogress``,
  found by the driver before each run), less a margin: what a live or crashed writer has not sealed yet.

A row not yet admitted waits in the state like any other and is stepped with its window; it only does
not close windows. Nothing is late unless its window was closed by admitted rows of its own key.

**Silent keys.** A thermostat that stops reporting would keep its last windows open until it sent again.
Each key with rows waiting sets an event-time timeout on the same watermark: when the fleet's receive
horizon is ``idle_ms`` past the key's latest receive time, the key's waiting rows are all stepped and its
windows closed (``closed``); a row for them that comes later is late. The clock is the cloud's receive
time, not the Spark host's: Spark's processing-time timeout runs a micro-batch after every micro-batch,
so a ``--once`` (``availableNow``) run would never end, and a replay of old data would close everything.

``dedup``: copies of a message (same ``message_id``) are reduced to the earliest received one
(``dedup.COPY_ORDER``) before the step sees them, whichever micro-batch brought which copy. Copies that
share ``ready_at`` (a reading's copies have one reading time) are always stepped together. When copies can
have different ``ready_at`` (latency is windowed by receive time), ``remember_ms`` keeps the ids stepped
for that long after their time, so a redelivery that lands after its first copy was counted is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from pipeline.jobs.dedup import COPY_ORDER, KEY
from pipeline.jobs.schemas import OutputSchema

# progress: latest admitted event time; closed: the latest ready_at closed by the idle timeout;
# received: the key's latest receive time (what the idle timeout counts from)
STATE_SCHEMA = "last string, waiting string, progress long, seen string, closed long, received long"
RECEIVED = "received_ms"
_NEVER = -(2**62)
# Spark checks that a fold with an event-time timeout sees a watermarked column; it also drops the rows
# whose value in that column is behind the watermark. The fold's is a null column that carries the
# watermark's metadata: the check passes and no row is dropped by Spark (the fold judges lateness itself).
_WATERMARK_CARRIER = "_receive_watermark"
_WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


@dataclass(frozen=True)
class StreamTiming:
    """What a streaming run judges time by (``ordered.py``'s docstring)."""

    lateness_ms: int
    idle_ms: int | None = None  # close a key's windows this long after its last receipt (None: never)
    open_since_ms: int | None = None  # receive horizon from the landing files still being written


def watermark_of(state) -> int:
    """The query's watermark on ``received_ms`` (0 before the first one); outside Spark (bench adapters
    without one): no bound."""
    getter = getattr(state, "getCurrentWatermarkMs", None)
    return int(getter()) if getter is not None else 2**62


def receive_horizon(watermark: int, timing: StreamTiming) -> int:
    """The receive time up to which every row is in: the watermark, bounded by the oldest open landing
    file. Before the first watermark Spark says 0: nothing is admitted on a query's first batch."""
    return watermark if timing.open_since_ms is None else min(watermark, timing.open_since_ms)


def receive_watermarked(frame: DataFrame, timing: StreamTiming) -> DataFrame:
    """``frame`` under the query's watermark on ``received_ms``, ``timing.lateness_ms`` behind the newest
    receipt of every row that passes here: filters below it leave the watermark the fleet's."""
    return frame.withColumn("_received_at", F.timestamp_millis(RECEIVED)).withWatermark(
        "_received_at", f"{timing.lateness_ms} milliseconds")


def kept_after_watermark(frame: DataFrame, condition: Column) -> DataFrame:
    """``frame`` (``receive_watermarked``) where ``condition`` holds, the filter kept above the watermark:
    Spark's optimizer pushes below ``withWatermark`` every conjunct that does not read the event-time
    column (``PushPredicateThroughNonJoin``), and the watermark then saw only the rows kept (the
    quarantine's horizon moved with the rejects' receipts alone, and a reject waited for the next one).
    One conjunct that reads the event-time column stays above it."""
    return frame.where(F.when(F.col("_received_at").isNotNull(), condition).otherwise(F.lit(False)))


def watched(frame: DataFrame, timing: StreamTiming, columns: list[str]) -> DataFrame:
    """``columns`` of ``frame`` (watermarked by ``receive_watermarked``), with the column that carries the
    watermark to an event-time timeout."""
    carrier = F.lit(None).cast("timestamp").alias(
        _WATERMARK_CARRIER, metadata={_WATERMARK_DELAY_KEY: timing.lateness_ms})
    return frame.select(*columns, carrier)


# step(key, last, rows in time order) -> (output rows, what to remember for the next rows)
Step = Callable[[tuple, "dict | None", pd.DataFrame], "tuple[pd.DataFrame, dict | None]"]


def same_time(times: pd.Series) -> pd.Series:
    return times


def first_copies(rows: pd.DataFrame, key: str = KEY) -> pd.DataFrame:
    """The earliest received copy of each ``key`` (``dedup.first_copies``, in pandas)."""
    ordered = rows.sort_values([key, *COPY_ORDER], kind="stable", na_position="last")
    return ordered.drop_duplicates(key, keep="first")


@dataclass(frozen=True)
class OrderedFold:
    keys: tuple[str, ...]
    time_ms: str  # long column, Unix ms: the order, the key's progress, and what ready_at reads
    columns: tuple[str, ...]  # what the step reads besides the keys, time_ms first
    output: str  # DDL of the step's output, key columns included
    step: Step
    ready_at: Callable[[pd.Series], pd.Series] = same_time  # when a row may be stepped
    dedup: bool = False  # keep the earliest received copy per dedup_key (needs COPY_ORDER columns)
    dedup_key: str = KEY
    remember_ms: int = 0  # with dedup: how long stepped ids are remembered, after their time_ms

    def in_order(self, rows: pd.DataFrame) -> pd.DataFrame:
        return rows.sort_values(list(self.columns), kind="stable").reset_index(drop=True)

    def _read(self) -> list[str]:
        extra = [self.dedup_key, *COPY_ORDER] if self.dedup else []
        return [name for name in dict.fromkeys([*self.columns, *extra, RECEIVED]) if name not in self.keys]

    def stream(self, frame: DataFrame, timing: StreamTiming | int) -> DataFrame:
        """Each key closes its rows by its own admitted progress (``timing``: a ``StreamTiming``, or the
        lateness alone). ``frame`` needs ``received_ms``; the watermark on it is set here."""
        timing = timing if isinstance(timing, StreamTiming) else StreamTiming(timing)
        return watched(receive_watermarked(frame, timing), timing, [*self.keys, *self._read()]).groupBy(
            *self.keys).applyInPandasWithState(
            self.per_key(timing), self.output, STATE_SCHEMA, "append", GroupStateTimeout.EventTimeTimeout
        )

    def per_key(self, timing: StreamTiming | int):
        """What ``stream`` runs for one key and one micro-batch (or timeout): ``run(key, chunks, state)``
        with a ``GroupState`` (``exists``, ``get``, ``update``, ``getCurrentWatermarkMs``,
        ``setTimeoutTimestamp``) of ``STATE_SCHEMA``; bench/stream_state.py runs it under
        ``transformWithStateInPandas`` too."""
        timing = timing if isinstance(timing, StreamTiming) else StreamTiming(timing)
        lateness_ms = timing.lateness_ms
        columns = self._read()

        def run(key, chunks, state):
            last, waiting, progress, seen, closed, received = None, [], _NEVER, {}, _NEVER, _NEVER
            if state.exists:
                saved_last, saved_waiting, progress, saved_seen, closed, received = state.get
                last, waiting, seen = json.loads(saved_last), json.loads(saved_waiting), json.loads(saved_seen)
            watermark = watermark_of(state)
            horizon = receive_horizon(watermark, timing)
            frames = [chunk[columns] for chunk in chunks]
            new = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
            # rows whose time was closed (by admitted progress or the idle timeout) before they came are late
            new = new[self.ready_at(new[self.time_ms]) > max(progress - lateness_ms, closed)]
            if len(new):
                received = max(received, int(new[RECEIVED].max()))
            rows = pd.concat([pd.DataFrame(waiting, columns=columns), new], ignore_index=True) if waiting else new
            admitted = rows[rows[RECEIVED] <= horizon]
            if len(admitted):
                progress = max(progress, int(admitted[self.time_ms].max()))
            if self.dedup and seen:
                rows = rows[~rows[self.dedup_key].isin(seen.keys())]
            idle = timing.idle_ms is not None and len(rows) > 0 and horizon >= received + timing.idle_ms
            close_to = int(self.ready_at(rows[self.time_ms]).max()) if idle else progress - lateness_ms
            output = None
            ready = self.ready_at(rows[self.time_ms]) <= close_to
            if ready.any():
                stepped = rows[ready]
                if self.dedup:  # the earliest copy of an id may still be waiting: it wins, the others go
                    chosen = first_copies(rows, self.dedup_key)
                    stepped = chosen[self.ready_at(chosen[self.time_ms]) <= close_to]
                    rows = rows[~rows[self.dedup_key].isin(stepped[self.dedup_key])]
                    if self.remember_ms:
                        seen.update(zip(stepped[self.dedup_key], (int(t) for t in stepped[self.time_ms]), strict=True))
                        seen = {k: t for k, t in seen.items() if t > close_to - self.remember_ms}
                else:
                    rows = rows[~ready]
                if idle:
                    closed = max(closed, close_to)
                if len(stepped):
                    output, last = self.step(key, last, self.in_order(stepped))
            state.update((json.dumps(last), json.dumps(rows.to_dict("records")), progress, json.dumps(seen),
                          closed, received))
            if len(rows) and hasattr(state, "setTimeoutTimestamp"):
                # be called again when the horizon admits the oldest waiting row, or the key falls idle
                pending = rows[RECEIVED][rows[RECEIVED] > horizon]
                wake = [int(pending.min())] if len(pending) else []
                if timing.idle_ms is not None:
                    wake.append(received + timing.idle_ms)
                if wake:
                    state.setTimeoutTimestamp(max(min(wake), watermark + 1))
            if output is not None and len(output):
                yield output

        return run


REJECTS_STATE_SCHEMA = "seen string, waiting string"


def first_rejects_stream(rejects: DataFrame, timing: StreamTiming, remember_ms: int, key: str,
                         output: OutputSchema) -> DataFrame:
    """Rejects (``output``'s computed columns, ``key`` naming a rejected message across its copies, and
    the copy order's columns; derived from a ``receive_watermarked`` frame of every row the query reads,
    so that the horizon moves with the fleet's receipts, not the rejects' alone) in streaming, one per
    ``key``, per gateway: the earliest received copy, as
    batch keeps. A reject is no window, so it is written as soon as no earlier copy can still come: once
    one of its copies is behind the receive horizon (every copy received before that one is in, from
    whichever writer, however late its file was sealed). Written in the first micro-batch that brought a
    copy, a reject whose first copy was in a writer's open file was the copy's, 20 s later. Its key is
    then remembered for ``remember_ms`` of the horizon, so a later copy is dropped and the state stays
    bounded; copies wait in the state until then."""
    columns = [name for name in dict.fromkeys([*output.names, key, *COPY_ORDER]) if name != "gateway_id"]

    def run(gateway, chunks, state):
        seen, waiting = {}, []
        if state.exists:
            saved_seen, saved_waiting = state.get
            seen, waiting = json.loads(saved_seen), json.loads(saved_waiting)
        watermark = watermark_of(state)
        horizon = receive_horizon(watermark, timing)
        frames = [pd.DataFrame(waiting, columns=columns)] if waiting else []
        frames += [chunk[columns] for chunk in chunks]
        rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
        rows = rows[~rows[key].isin(seen.keys())]
        ready = rows[key].isin(rows.loc[rows[RECEIVED] <= horizon, key])
        written = first_copies(rows[ready], key)
        seen.update(zip(written[key], (int(t) for t in written[RECEIVED]), strict=True))
        seen = {k: t for k, t in seen.items() if t > horizon - remember_ms}
        rows = rows[~ready]
        state.update((json.dumps(seen), json.dumps(rows.to_dict("records"))))
        if len(rows):  # be called again when the horizon passes the oldest waiting copy
            state.setTimeoutTimestamp(max(int(rows[RECEIVED].min()), watermark + 1))
        if len(written):
            yield written.assign(gateway_id=gateway[0])[output.names]

    keyed = rejects.withColumn("gateway_id", F.coalesce("gateway_id", F.lit("")))
    return watched(keyed, timing, ["gateway_id", *columns]).groupBy("gateway_id").applyInPandasWithState(
        run, output.ddl, REJECTS_STATE_SCHEMA, "append", GroupStateTimeout.EventTimeTimeout)
