"""Delivery SLA: latency percentiles, and counter increases from the gateway's metrics."""

import pandas as pd

from pipeline.envelope import land
from pipeline.jobs import delivery
from pipeline.jobs.bronze import from_records
from tests.pipeline.pipeline_data import MINUTE, at, reading

WINDOW = 5 * MINUTE


def samples(*rows):
    columns = ["sample_ms", "sent", "expired", "dropped", "retries", "depth", "oldest_age_s"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["dead_lettered"] = None  # metrics of a gateway from before dead letters: the field is absent
    return frame


def test_counters_count_increases_resets_from_zero_and_repeats_add_nothing():
    step = delivery.counter_step(WINDOW)
    out, last = step(("gw1", "upstream", 5), None, samples(
        (at(1), 10, 1, 0, 0, 4, 2.0),
        (at(2), 15, 1, 0, 1, 7, 3.5),
        (at(2), 15, 1, 0, 1, 7, 3.5),  # the same metrics message again
        (at(6), 3, 0, 0, 0, 1, 0.5),  # the gateway restarted
        (at(7), 8, 2, 1, 0, 0, 0.0),
    ))
    assert out.sort_values("window_start_ms")[
        ["window_start_ms", "samples", "sent", "expired", "dropped", "retries", "depth_max", "oldest_age_s_max"]
    ].values.tolist() == [[at(0), 2, 15, 1, 0, 1, 7, 3.5], [at(5), 2, 8, 2, 1, 0, 1, 0.5]]
    assert last == {"sent": 8, "expired": 2, "dropped": 1, "retries": 0, "dead_lettered": 0}
    assert out["dead_lettered"].tolist() == [0, 0]

    later, _ = step(("gw1", "upstream", 5), last, samples((at(11), 9, 2, 1, 0, 0, 0.0)))
    assert later[["sent", "expired"]].values.tolist() == [[1, 0]]  # continues from what it remembered


def test_latency_percentiles_per_gateway_priority_and_receive_window(spark):
    messages = [reading("gw1", "t1", n, 0, 20.0, 20.0, False, latency_ms=n * 100, priority=n % 2)
                for n in range(1, 201)]
    events = from_records(spark, [land(m).record for m in messages])
    rows = {r.priority: r for r in delivery.latency(events, "5 minutes").collect()}
    odd, even = rows[1], rows[0]  # odd latencies 100, 300, ... 19900; even 200 ... 20000
    assert (odd.delivered, even.delivered) == (100, 100)
    assert (odd.latency_p50_ms, odd.latency_p95_ms, odd.latency_p99_ms, odd.latency_max_ms) == (9900, 18900, 19700, 19900)
    assert (even.latency_p50_ms, even.latency_max_ms) == (10000, 20000)


def test_latency_percentiles_are_exact_in_a_window_of_any_size(spark):
    """Past 10,000 messages in a window, percentile_approx (accuracy 10000) may answer a neighbour of the
    percentile; batch computes it exactly, as DuckDB's ``quantile_disc`` and the streaming step do."""
    import duckdb
    from pyspark.sql import functions as F

    count = 40_000
    received = F.lit(at(0)) + F.col("id") % 1000
    rows = spark.range(count).select(
        F.lit("gw1").alias("gateway_id"), (F.col("id") % 2).cast("int").alias("priority"), received.alias("received_ms"),
        (received - (F.col("id") * 7919) % 30_011).alias("enqueued_ms"),  # latencies spread, some repeated
    )
    got = delivery.latency(rows.withColumn("received_at", F.timestamp_millis("received_ms")), "5 minutes")
    got = sorted(tuple(r) for r in got.select("priority", "delivered", "latency_p50_ms", "latency_p95_ms",
                                              "latency_p99_ms", "latency_max_ms").collect())

    frame = rows.toPandas()  # noqa: F841 - DuckDB reads it by name
    expected = duckdb.sql("""
        SELECT priority, count(*), quantile_disc(received_ms - enqueued_ms, 0.5),
               quantile_disc(received_ms - enqueued_ms, 0.95), quantile_disc(received_ms - enqueued_ms, 0.99),
               max(received_ms - enqueued_ms)
        FROM frame GROUP BY priority ORDER BY priority""").fetchall()
    assert got == [tuple(row) for row in expected]
    step, _ = delivery.latency_step(5 * MINUTE)(("gw1",), None, frame)
    assert sorted(tuple(r) for r in step[["priority", "delivered", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms",
                                          "latency_max_ms"]].itertuples(index=False)) == got
