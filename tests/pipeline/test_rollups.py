"""Five-minute rollups: window boundaries and what each column means."""

from datetime import UTC, datetime

from pipeline.envelope import land
from tests.pipeline.pipeline_data import at, reading


def test_windows_are_half_open_and_epoch_aligned_and_aggregate_as_documented(spark):
    from pipeline.jobs import rollups, telemetry
    from pipeline.jobs.bronze import from_records

    taken = [  # (minute, temperature, set point, heater)
        (0.0, 19.0, 20.0, True),
        (2.0, 20.0, 20.0, True),
        (4.99998, 21.0, 21.0, False),  # 04:59.999 - still the first window
        (5.0, 30.0, 22.0, False),  # 05:00.000 - the second
    ]
    messages = [reading("gw1", "t1", n, minute, temp, sp, heat) for n, (minute, temp, sp, heat) in enumerate(taken)]
    events = from_records(spark, [land(m).record for m in messages])
    rows = rollups.rollups(telemetry.readings(telemetry.parse(events)), "5 minutes").orderBy("window_start").collect()
    assert [(r.window_start, r.window_end) for r in rows] == [
        (_ts(at(0)), _ts(at(5))), (_ts(at(5)), _ts(at(10)))]
    first, second = rows
    assert (first.readings, first.temperature_min, first.temperature_avg, first.temperature_max) == (3, 19.0, 20.0, 21.0)
    assert first.set_point_last == 21.0 and abs(first.set_point_avg - 61 / 3) < 1e-9
    assert abs(first.heater_duty_cycle - 2 / 3) < 1e-9
    assert (second.readings, second.temperature_avg, second.heater_duty_cycle) == (1, 30.0, 0.0)
    assert first.date == "2026-01-01"


def _ts(ms):
    """Spark returns naive datetimes in the session time zone, which is UTC."""
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)


def test_window_arithmetic_puts_every_time_where_spark_window_does(spark):
    """The windowed outputs group by ``windows.window_start_ms`` (a long), not by ``F.window``'s struct; both
    agree on every time, window boundaries and times before 1970 included (``pmod``, not ``%``)."""
    from pyspark.sql import functions as F

    from pipeline.jobs.windows import window_columns, window_start_ms

    window_ms = 5 * 60_000
    times = [t + d for t in (-2 * window_ms, -window_ms, 0, window_ms, at(0), 1_764_000_000_000) for d in (-1, 0, 1)]
    frame = spark.createDataFrame([(t,) for t in times], "t long").select(
        "t", window_start_ms("t", window_ms).alias("start_ms"), F.window(F.timestamp_millis("t"), "5 minutes").alias("w"))
    rows = frame.select("t", "start_ms", *window_columns("start_ms", window_ms), "w.start", "w.end").collect()
    assert len(rows) == len(times)
    for t, start_ms, start, end, date, expected_start, expected_end in rows:
        assert start_ms <= t < start_ms + window_ms and start_ms % window_ms == 0, t
        assert (start, end) == (expected_start, expected_end), t
        assert date == expected_start.strftime("%Y-%m-%d"), t
