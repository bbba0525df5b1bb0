"""Batch's change log (``setpoints.changes`` without lateness: ``lag`` over the readings its bucket summary
picks) equals the rule it implements - each thermostat's readings in (reading time, message id) order, the
first one logged with no previous set point and every one whose set point differs from the reading
before it - on adversarial readings: set points that change at every reading or flap A-B-A inside one
bucket and across bucket edges, ties in reading time between set points, -0.0 beside 0.0, one reading per
thermostat, the same device id under two gateways, times before the epoch.

The rule's reference is plain Python here, not in the product. Each example is several zones of readings
at once, kept apart by their device and message ids (the rule is per thermostat), in one Spark job: a
job costs seconds, a row nothing.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st

from testing.campaigns import campaign

#: ``setpoints.BUCKET_MS``, written out: the examples and strategies below are built at collection, which
#: every test worker does, and ``pipeline.jobs.setpoints`` imports pyspark and pandas. The test holds it equal.
BUCKET = 60 * 60_000
COLUMNS = "gateway_id string, device_id string, reading_ms long, message_id string, set_point double, temperature double"
# Reading times cluster on bucket edges so that runs cross them and readings tie there.
EDGES = [-BUCKET - 1, -BUCKET, -1, 0, 1, BUCKET - 1, BUCKET, BUCKET + 1, 2 * BUCKET - 1, 2 * BUCKET, 5 * BUCKET + 17]
SET_POINTS = [20.0, 21.5, 19.0, 0.0, -0.0]


@st.composite
def thermostat(draw: st.DrawFn, number: int) -> list[tuple]:
    """One thermostat's readings: times from a small pool (ties), set points in runs of drawn lengths."""
    gateway, device = draw(st.sampled_from(["gw0", "gw1"])), f"t{number // 2}"  # t0 under gw0 and gw1
    pool = draw(st.lists(st.sampled_from(EDGES) | st.integers(-2 * BUCKET, 6 * BUCKET), min_size=1, max_size=8))
    count = draw(st.integers(1, 30))
    times = sorted(draw(st.lists(st.sampled_from(pool), min_size=count, max_size=count)))
    values: list[float] = []
    while len(values) < count:
        values += [draw(st.sampled_from(SET_POINTS))] * draw(st.integers(1, 6))
    ids = draw(st.permutations(range(count)))  # "m10" sorts before "m2": ties are broken as text
    return [(gateway, device, time_ms, f"{gateway}/{device}/m{ids[i]}", values[i], 15.0 + number + i / 100)
            for i, time_ms in enumerate(times)]


@st.composite
def readings(draw: st.DrawFn) -> list[tuple]:
    thermostats = draw(st.integers(1, 12))
    rows = [row for number in range(thermostats) for row in draw(thermostat(number))]
    return list({row[3]: row for row in rows}.values())  # a message id once (deduplicated upstream)


def lag_rule(rows: list[tuple]) -> list[tuple]:
    """The change log by its definition: one pass over each thermostat's readings in order."""
    logged, previous = [], {}
    for gateway, device, time_ms, message_id, set_point, temperature in sorted(rows, key=lambda row: (row[0], row[1], row[2], row[3])):
        key = (gateway, device)
        if key not in previous or previous[key] != set_point:  # 0.0 == -0.0: no change
            logged.append((gateway, device, time_ms, previous.get(key), set_point, temperature, message_id))
        previous[key] = set_point
    return logged


def exactly(row: tuple) -> tuple:
    """A row with each float's sign kept apart, so that -0.0 and 0.0 compare different."""
    return tuple((value, math.copysign(1.0, value)) if isinstance(value, float) else value for value in row)


FLAP_ACROSS_AN_EDGE = [("gw0", "t0", BUCKET - 1 + step, f"m{step}", [20.0, 21.0][step % 2], 15.0) for step in range(4)]
TIE_AT_A_BUCKET_START = [("gw0", "t0", 0, "mB", 21.0, 15.0), ("gw0", "t0", BUCKET, "mA", 20.0, 16.0),
                         ("gw0", "t0", BUCKET, "mC", 21.0, 17.0), ("gw0", "t0", BUCKET + 5, "mD", 21.0, 18.0)]
SIGNED_ZEROS = [("gw0", "t0", step * BUCKET // 2, f"m{step}", [0.0, -0.0, 0.0, -0.0, 5.0][step], 15.0) for step in range(5)]
A_B_A_IN_ONE_BUCKET = [("gw0", "t0", step * 60_000, f"m{step}", [20.0, 20.0, 21.0, 20.0, 20.0][step], 15.0) for step in range(5)]
RUNS_ACROSS_BUCKETS = [("gw1", "t0", step * BUCKET // 3, f"m{step:02d}", 18.0 + step // 4, 15.0) for step in range(12)]


#: Zones per example and examples: 20-40 zones of 1-12 thermostats, in 5 Spark jobs (and one for the
#: hand-written zones).
ZONES = (4, 8)
EXAMPLES = 5


def union_of_zones(zones: list[list[tuple]]) -> list[tuple]:
    """The zones as one set of readings: each zone's device and message ids prefixed by its number (which
    keeps a thermostat's message ids in the same order as text)."""
    return [(gateway, f"z{zone}.{device}", time_ms, f"z{zone}.{message_id}", set_point, temperature)
            for zone, rows in enumerate(zones)
            for gateway, device, time_ms, message_id, set_point, temperature in rows]


@example(zones=[FLAP_ACROSS_AN_EDGE, TIE_AT_A_BUCKET_START, SIGNED_ZEROS, A_B_A_IN_ONE_BUCKET, RUNS_ACROSS_BUCKETS,
                [("gw0", "t0", 7, "m0", 20.0, 15.0)]])
@campaign(EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(zones=st.lists(readings(), min_size=ZONES[0], max_size=ZONES[1]))
def test_the_batch_change_log_is_lag_over_every_reading(spark, zones):
    from pipeline.jobs import setpoints

    assert setpoints.BUCKET_MS == BUCKET, "the edges the readings cluster on are not the job's buckets"
    rows = union_of_zones(zones)
    logged = setpoints.changes(spark.createDataFrame(rows, COLUMNS)).select(
        "gateway_id", "device_id", "changed_ms", "previous_set_point", "set_point", "temperature", "message_id")
    got = sorted((exactly(tuple(row)) for row in logged.collect()), key=repr)
    assert got == sorted((exactly(row) for row in lag_rule(rows)), key=repr)
