"""Per-key computations that need a key's rows in time order in Structured Streaming, with the event-time
progress of each key on its own.

A computation is written once as a pandas ``step(key, last, rows) -> (output, last)``: ``rows`` are one
key's rows in time order, ``last`` is what the step remembered from the rows before them. Batch computes
the same columns in Spark SQL (window functions, ``lag``: no Python worker on its path, a pandas call per
key cost several times more), and the tests hold each pair equal (tests/pipeline/test_batch_plan.py for
the queue counters, test_stream*.py for streaming against batch).

Streaming calls it through ``applyInPandasWithState``, and the key's state carries its own clock: the
latest event time seen *for that key* (``progress``). A row may be stepped once ``progress - lateness``
has reached its ``ready_at`` (for a window: the window's end); until then it waits in the state. A row
that arrives when its ``ready_at`` is already behind ``progress - lateness`` - its window was closed and
written - is late and dropped, as Spark drops rows behind a watermark. Spark's own watermark is one for
the whole query, the minimum or maximum over every key, so one gateway's on-time data made another's
backlog late; here a gateway draining a day-old backlog is judged by its own times only. Nothing waits
for a processing-time clock: what closes a key's windows is that key's own later data.

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
from pyspark.sql import DataFrame
from pyspark.sql.streaming.state import GroupStateTimeout

from pipeline.jobs.dedup import COPY_ORDER, KEY

STATE_SCHEMA = "last string, waiting string, progress long, seen string"

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
        return [name for name in dict.fromkeys([*self.columns, *extra]) if name not in self.keys]

    def stream(self, frame: DataFrame, lateness_ms: int) -> DataFrame:
        """Each key closes its rows by its own progress; ``frame`` needs no watermark."""
        return frame.select(*self.keys, *self._read()).groupBy(*self.keys).applyInPandasWithState(
            self.per_key(lateness_ms), self.output, STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout
        )

    def per_key(self, lateness_ms: int):
        """What ``stream`` runs for one key and one micro-batch: ``run(key, chunks, state)`` with a
        ``GroupState`` (``exists``, ``get``, ``update``) of ``STATE_SCHEMA``; bench/stream_state.py runs it
        under ``transformWithStateInPandas`` too."""
        columns = self._read()

        def run(key, chunks, state):
            last, waiting, progress, seen = None, [], None, {}
            if state.exists:
                saved_last, saved_waiting, progress, saved_seen = state.get
                last, waiting, seen = json.loads(saved_last), json.loads(saved_waiting), json.loads(saved_seen)
            new = pd.concat([chunk[columns] for chunk in chunks], ignore_index=True)
            if progress is not None:  # rows whose time was closed before they came are late
                new = new[self.ready_at(new[self.time_ms]) > progress - lateness_ms]
            if len(new):
                progress = max(progress if progress is not None else -(2**62), int(new[self.time_ms].max()))
            rows = pd.concat([pd.DataFrame(waiting, columns=columns), new], ignore_index=True) if waiting else new
            if self.dedup and seen:
                rows = rows[~rows[self.dedup_key].isin(seen.keys())]
            output = None
            ready = self.ready_at(rows[self.time_ms]) <= (progress if progress is not None else 0) - lateness_ms
            if ready.any():
                stepped = rows[ready]
                if self.dedup:  # the earliest copy of an id may still be waiting: it wins, the others go
                    chosen = first_copies(rows, self.dedup_key)
                    stepped = chosen[self.ready_at(chosen[self.time_ms]) <= progress - lateness_ms]
                    rows = rows[~rows[self.dedup_key].isin(stepped[self.dedup_key])]
                    if self.remember_ms:
                        seen.update(zip(stepped[self.dedup_key], (int(t) for t in stepped[self.time_ms]), strict=True))
                        seen = {k: t for k, t in seen.items() if t > progress - lateness_ms - self.remember_ms}
                else:
                    rows = rows[~ready]
                if len(stepped):
                    output, last = self.step(key, last, self.in_order(stepped))
            state.update((json.dumps(last), json.dumps(rows.to_dict("records")), progress, json.dumps(seen)))
            if output is not None and len(output):
                yield output

        return run
