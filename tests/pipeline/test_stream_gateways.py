"""Streaming that fits store-and-forward gateways: each thermostat, gateway and queue closes its windows on
its own times, so a gateway draining a day-old backlog beside on-time ones loses nothing; copies of a
message count once, the earliest received, whatever micro-batch brings them. Held equal to batch and to
the independent DuckDB computation on every closed window, cron style, in several trigger sizes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pipeline.envelope import Incoming
from pipeline.jobs.settings import JobSettings
from tests.pipeline import duckdb_reference
from tests.pipeline.pipeline_data import MINUTE, T0, metrics, reading, write_batch

if TYPE_CHECKING:  # imported where used: every `make test` worker collects this folder and runs no Spark
    import pandas as pd

pytestmark = pytest.mark.slow  # several streaming runs: a minute or more on the 2-core machine

LATENESS = "10 minutes"
LATENESS_MS = 10 * MINUTE
WINDOW_MS = 5 * MINUTE
DAY = 24 * 60


def copy_of(message: Incoming, delay_ms: int) -> Incoming:
    return Incoming(message.topic, message.payload, message.received_ms + delay_ms, message.user_properties,
                    message.content_type, True)


def two_days() -> list[Incoming]:
    """gwa and gwb on time for two days (a reading every 10 minutes); gwc down from day 1 06:00 to day 2
    06:00, then draining its backlog oldest first (a message every 2 s) before it is on time again. gwa
    sends metrics; some gwa readings are redelivered an hour later (another hour partition), two gwc
    ones are sent twice in the backlog, and one gwb reading is malformed."""
    out = []
    outage_end = T0 + (DAY + 6 * 60) * MINUTE
    for n in range(2 * DAY // 10):
        minute = n * 10 + 1
        set_point = 20.0 + (n // 13) % 3
        a = reading("gwa", "ta", n + 1, minute, 19 + n % 7, set_point, n % 2 == 0)
        out.append(a)
        if n % 17 == 0:
            out.append(copy_of(a, 61 * MINUTE))
        out.append(reading("gwb", "tb", n + 1, minute + 3, 17 + n % 5, 19.0, True, priority=2, latency_ms=4_000))
        received = T0 + minute * MINUTE + 800
        if 6 * 60 <= minute < DAY + 6 * 60:
            received = outage_end + (minute - 6 * 60) * 200  # the backlog, in order
        c = reading("gwc", "tc", n + 1, minute + 5, 21 + n % 3, 21.0 + (n // 40), False, received_ms=received)
        out.append(c)
        if n in (40, 41):
            out.append(copy_of(c, 900))
        if n % 3 == 0:
            out.append(metrics("gwa", minute, {5: {"sent": n * 2, "depth": n % 4, "oldest_age_s": 0.5}}))
    out.append(reading("gwb", "tb", 9999, 100, 0, 0, False, payload=b"{broken"))
    return out


def land_by_hour(landing, messages, first_index=0) -> int:
    """One landing batch per receive hour, in receive order (an ingest sealing its files)."""
    by_hour: dict[int, list] = {}
    for message in messages:
        by_hour.setdefault((message.received_ms - T0) // (60 * MINUTE), []).append(message)
    for index, hour in enumerate(sorted(by_hour)):
        write_batch(landing, by_hour[hour], first_index + index)
    return first_index + len(by_hour)


IDLE = "30 minutes"  # JobSettings' default
IDLE_MS = 30 * MINUTE


def closed(frame: pd.DataFrame, keys: list[str], end: str, progress: pd.DataFrame) -> pd.DataFrame:
    """The rows whose window (or row time) is closed by its key's own admitted progress, or by the key's
    idle timeout."""
    joined = frame.merge(progress, on=keys)
    shut = (joined[end] + LATENESS_MS <= joined["progress"]) | joined["idle"]
    return joined[shut].drop(columns=["progress", "idle"])


def ms(series: pd.Series) -> pd.Series:
    import pandas as pd

    return (series - pd.Timestamp(0)) // pd.Timedelta(milliseconds=1)


def comparable(frame: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    frame["date"] = frame["date"].astype(str)  # a date when read back from the partition folders
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            frame[column] = ms(frame[column])
    return duckdb_reference.comparable(frame)


def progress_of(landing) -> dict[str, pd.DataFrame]:
    """Each key's admitted progress (the latest event time among its rows received by the receive horizon:
    the newest receive time of the query's input less the lateness) and whether it is idle (the horizon
    is the idle timeout past its last receipt), as the last run leaves them (ordered.py)."""
    con = duckdb_reference.connect(landing)

    def per_key(rows: str, keys: str, event: str) -> pd.DataFrame:
        return con.execute(f"""
            WITH input AS ({rows}), horizon AS (SELECT max(received_ms) - {LATENESS_MS} AS h FROM input)
            SELECT {keys}, coalesce(max({event}) FILTER (WHERE received_ms <= h), -1e18)::BIGINT AS progress,
                   max(received_ms) + {IDLE_MS} <= any_value(h) AS idle
            FROM input, horizon GROUP BY ALL""").df()

    readings = ("SELECT gateway_id, device_id, received_ms, (pj ->> '$.ts_ms')::BIGINT AS reading_ms "
                "FROM telemetry WHERE telemetry_reason IS NULL")
    events = "SELECT gateway_id, received_ms FROM landed WHERE kind = 'events' AND gateway_id IS NOT NULL"
    samples = ("SELECT line ->> '$.gateway_id' AS gateway_id, "
               "(line ->> '$.received_ms')::BIGINT AS received_ms FROM checked WHERE kind = 'metrics'")
    return {
        "rollups": per_key(readings, "gateway_id, device_id", "reading_ms"),
        "delivery_latency": per_key(events, "gateway_id", "received_ms"),
        "queue_counters": per_key(samples, "gateway_id", "received_ms"),  # windows of receive time
    }


def expected_closed(name: str, frame: pd.DataFrame, progress: dict) -> pd.DataFrame:
    if name == "rollups":
        return closed(frame, ["gateway_id", "device_id"], "window_end", progress["rollups"])
    if name == "setpoint_changes":
        return closed(frame.assign(end=frame["changed_ms"]), ["gateway_id", "device_id"], "end",
                      progress["rollups"]).drop(columns="end")
    if name == "delivery_latency":
        return closed(frame, ["gateway_id"], "window_end", progress["delivery_latency"])
    if name == "queue_counters":
        return closed(frame, ["gateway_id"], "window_end", progress["queue_counters"])
    return frame


@pytest.mark.timeout(600)  # one landing file per trigger: ~100 compaction and ~50x5 output micro-batches, 2-5 min
@pytest.mark.parametrize("files_per_trigger", [1, 5, None])
def test_cron_style_runs_agree_with_batch_and_duckdb_on_every_closed_window(spark, tmp_path, files_per_trigger):
    import pandas as pd

    from pipeline.jobs import batch, stream
    from pipeline.jobs.source import StreamOptions

    messages = two_days()
    day_one = [m for m in messages if m.received_ms < T0 + DAY * MINUTE]
    day_two = [m for m in messages if m.received_ms >= T0 + DAY * MINUTE]
    landing, out, checkpoint = tmp_path / "landing", tmp_path / "out", tmp_path / "checkpoint"
    settings = JobSettings(str(landing), str(out), lateness=LATENESS)
    options = StreamOptions(max_files_per_trigger=files_per_trigger)
    last = land_by_hour(landing, day_one)  # yesterday's files, then a run; today's, then a run
    stream.run_stream(spark, settings, str(checkpoint), options, once=True, progress=lambda _: None)
    land_by_hour(landing, day_two, last)
    stream.run_stream(spark, settings, str(checkpoint), options, once=True, progress=lambda _: None)

    batched = batch.build(spark, settings)
    progress = progress_of(landing)
    for name in ("rollups", "setpoint_changes", "delivery_latency", "queue_counters", "quarantine"):
        streamed = comparable(spark.read.parquet(settings.output(name)).toPandas())
        whole = comparable(batched[name].toPandas())
        expected = duckdb_reference.comparable(expected_closed(name, whole, progress))
        assert len(expected) > 0, name
        pd.testing.assert_frame_equal(streamed[expected.columns], expected, obj=name)

    rollups = comparable(spark.read.parquet(settings.output("rollups")).toPandas())
    backlog = rollups[rollups["gateway_id"] == "gwc"]
    assert backlog["readings"].sum() >= 2 * DAY // 10 - 3  # every gwc reading but its last open windows
    reference = duckdb_reference.rollups(duckdb_reference.connect(landing))
    reference = reference.rename(columns={"window_start_ms": "window_start"})
    reference["window_end"] = reference["window_start"] + WINDOW_MS
    reference = duckdb_reference.comparable(expected_closed("rollups", reference, progress))
    pd.testing.assert_frame_equal(rollups[reference.columns], reference, check_dtype=False)
    latency = comparable(spark.read.parquet(settings.output("delivery_latency")).toPandas())
    # copies once; open: the windows of the last lateness of receive time behind the horizon (3 readings)
    assert latency[latency["gateway_id"] == "gwa"]["delivered"].sum() == 2 * DAY // 10 - 3
