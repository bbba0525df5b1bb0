"""Per-key computations that need rows in time order (what changed since the previous row), run the same
way in batch and in Structured Streaming.

Spark has no ordered window functions on streams, so such a computation is written once as a pandas
``step(key, last, rows) -> (output, last)``: ``rows`` are one key's rows in time order, ``last`` is what the
step remembered from the rows before them. Batch calls it once per key with every row
(``applyInPandas``). Streaming calls it through ``applyInPandasWithState`` with an event-time timeout: rows
wait in the state until the watermark has passed their ``ready_at`` time, then are stepped in order, so the
step sees the same rows in the same order as in batch. A row whose ``ready_at`` is not after what was
already stepped is late and dropped, as Spark drops rows behind the watermark.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql.streaming.state import GroupStateTimeout

STATE_SCHEMA = "last string, waiting string, stepped_until long"

# step(key, last, rows in time order) -> (output rows, what to remember for the next rows)
Step = Callable[[tuple, "dict | None", pd.DataFrame], "tuple[pd.DataFrame, dict | None]"]


def same_time(times: pd.Series) -> pd.Series:
    return times


@dataclass(frozen=True)
class OrderedFold:
    keys: tuple[str, ...]
    time_ms: str  # long column, Unix ms: the order, and what ready_at reads
    event_time: str  # the timestamp column the stream's watermark is on (same instant as time_ms)
    columns: tuple[str, ...]  # what the step reads besides the keys, time_ms first
    output: str  # DDL of the step's output, key columns included
    step: Step
    ready_at: Callable[[pd.Series], pd.Series] = same_time  # when a row may be stepped

    def in_order(self, rows: pd.DataFrame) -> pd.DataFrame:
        return rows.sort_values(list(self.columns), kind="stable").reset_index(drop=True)

    def batch(self, frame: DataFrame) -> DataFrame:
        columns = list(self.columns)

        def run(key, rows):
            output, _ = self.step(key, None, self.in_order(rows[columns]))
            return output

        return frame.select(*self.keys, *columns).groupBy(*self.keys).applyInPandas(run, self.output)

    def stream(self, frame: DataFrame) -> DataFrame:
        """``frame`` must carry a watermark on ``event_time``."""
        columns = list(self.columns)

        def run(key, chunks, state):
            last, waiting, stepped_until = None, [], None
            if state.exists:
                saved_last, saved_waiting, stepped_until = state.get
                last, waiting = json.loads(saved_last), json.loads(saved_waiting)
            rows = pd.DataFrame(waiting, columns=columns)
            for chunk in chunks:
                rows = pd.concat([rows, chunk[columns]], ignore_index=True) if len(rows) else chunk[columns]
            ready_at = self.ready_at(rows[self.time_ms])
            if stepped_until is not None:
                on_time = ready_at > stepped_until
                rows, ready_at = rows[on_time], ready_at[on_time]
            ready = ready_at <= state.getCurrentWatermarkMs()
            output = None
            if ready.any():
                output, last = self.step(key, last, self.in_order(rows[ready]))
                stepped_until = int(ready_at[ready].max())
            still_waiting = rows[~ready]
            state.update((json.dumps(last), json.dumps(still_waiting.to_dict("records")), stepped_until))
            if len(still_waiting):
                state.setTimeoutTimestamp(int(ready_at[~ready].min()))
            if output is not None and len(output):
                yield output

        return frame.select(*self.keys, *columns, self.event_time).groupBy(*self.keys).applyInPandasWithState(
            run, self.output, STATE_SCHEMA, "append", GroupStateTimeout.EventTimeTimeout
        )
