"""Tumbling windows aligned to the Unix epoch, by arithmetic on millisecond times.

Every windowed output (rollups, delivery latency, queue counters; batch and streaming) groups by the
window's start as a long, ``time_ms`` floored to a multiple of the window, and builds the window's
timestamps and ``date`` once per output row, after the aggregate. Spark's ``F.window`` groups by a struct
of two timestamps that it computes per input row, through projections and a filter of their own; that
was per-row work for a key a subtraction gives (``docs/pipeline.md``, "Windows").
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from pipeline.jobs.settings import parse_duration_ms

__all__ = ["parse_duration_ms", "window_columns", "window_start_ms"]


def window_start_ms(time_ms: str, window_ms: int) -> Column:
    """The start of the window ``time_ms`` is in: ``[start, start + window_ms)``. ``pmod``, not ``%``: a
    time before 1970 belongs to the window that starts before it, as in ``F.window``."""
    return F.col(time_ms) - F.pmod(F.col(time_ms), F.lit(window_ms))


def window_columns(start_ms: str, window_ms: int) -> tuple[Column, Column, Column]:
    """``window_start``, ``window_end`` (timestamps) and ``date`` (of the start, UTC) from ``start_ms``."""
    start = F.timestamp_millis(start_ms)
    return (start.alias("window_start"), F.timestamp_millis(F.col(start_ms) + window_ms).alias("window_end"),
            F.date_format(start, "yyyy-MM-dd").alias("date"))
