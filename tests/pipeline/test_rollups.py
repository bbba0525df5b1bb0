"""Five-minute rollups: window boundaries and what each column means."""

from datetime import UTC, datetime

from pipeline.envelope import land
from pipeline.jobs import rollups, telemetry
from pipeline.jobs.bronze import from_records
from tests.pipeline.pipeline_data import at, reading


def test_windows_are_half_open_and_epoch_aligned_and_aggregate_as_documented(spark):
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
