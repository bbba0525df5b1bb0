"""Delivery SLA: latency percentiles, and counter increases from the gateway's metrics."""


from pipeline.envelope import land
from tests.pipeline.pipeline_data import MINUTE, at, reading

WINDOW = 5 * MINUTE


def samples(*rows):
    import pandas as pd

    columns = ["sample_ms", "sent", "expired", "dropped", "retries", "depth", "oldest_age_s"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["dead_lettered"] = None  # metrics of a gateway from before dead letters: the field is absent
    frame["received_ms"] = frame["sample_ms"] + 500
    frame["boot"], frame["seq"] = "", frame["sample_ms"]  # a gateway that sends no boot id: ts_ms order
    return frame


def test_counters_count_increases_resets_from_zero_and_repeats_add_nothing():
    from pipeline.jobs import delivery

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
    assert last == {"sent": 8, "expired": 2, "dropped": 1, "retries": 0, "dead_lettered": 0, "_boot": "",
                    "_seq": at(7), "_boots": {"": at(1) + 500}}
    assert out["dead_lettered"].tolist() == [0, 0]

    later, _ = step(("gw1", "upstream", 5), last, samples((at(11), 9, 2, 1, 0, 0, 0.0)))
    assert later[["sent", "expired"]].values.tolist() == [[1, 0]]  # continues from what it remembered


def test_latency_percentiles_per_gateway_priority_and_receive_window(spark):
    from pipeline.jobs import delivery
    from pipeline.jobs.bronze import from_records

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

    from pipeline.jobs import delivery

    count = 40_000
    received = F.lit(at(0)) + F.col("id") % 1000
    rows = spark.range(count).select(
        F.lit("gw1").alias("gateway_id"), (F.col("id") % 2).cast("int").alias("priority"), received.alias("received_ms"),
        (received - (F.col("id") * 7919) % 30_011).alias("enqueued_ms"),  # latencies spread, some repeated
    )
    rows = rows.withColumn("sent_ms", F.col("enqueued_ms"))
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


def test_counters_follow_the_gateways_boot_and_sequence_not_its_clock():
    """Boot A: sent grows by 10 a minute; at its 4th document the clock steps back 10 minutes; then
    the gateway restarts (boot B, from zero). In ts_ms order every drop read as a restart."""
    import pandas as pd

    from pipeline.jobs import delivery

    step = delivery.counter_step(WINDOW)
    rows = []
    for seq in range(1, 9):
        clock = at(20 + seq) if seq < 4 else at(20 + seq - 10)
        rows.append(("A", seq, clock, at(20 + seq) + 300, 10 * seq))
    for seq in range(1, 4):
        rows.append(("B", seq, at(30 + seq), at(30 + seq) + 300, 7 * seq))
    frame = pd.DataFrame(rows, columns=["boot", "seq", "sample_ms", "received_ms", "sent"])
    for name in ("expired", "dropped", "retries", "dead_lettered", "depth", "oldest_age_s"):
        frame[name] = 0
    out, last = step(("gw1", "upstream", 5), None, frame.sample(frac=1, random_state=3))
    assert out["sent"].sum() == 80 + 21  # boot A's 80, boot B's 21: nothing counted twice
    assert last["_boot"] == "B" and last["sent"] == 21


def test_queue_counters_in_batch_follow_boot_and_sequence(spark):
    from pipeline.envelope import Incoming
    from pipeline.jobs import delivery
    from pipeline.jobs.bronze import from_records

    records = []
    for n, (boot, seq, clock, sent) in enumerate(
            [("A", 1, 100, 10), ("A", 2, 160, 20), ("A", 3, 220, 30), ("A", 4, -380, 40), ("A", 5, -320, 50),
             ("B", 1, 300, 5), ("B", 2, 360, 9)]):
        doc = {"gateway_id": "gw1", "ts_ms": at(10) + clock * 1000, "boot_id": boot, "seq": seq,
               "endpoints": {"upstream": {"5": {"sent": sent, "depth": 0, "oldest_age_s": 0}}}}
        records.append(land(Incoming("gateways/gw1/metrics", __import__("json").dumps(doc).encode(),
                                     at(10) + n * 60_000, content_type="application/json")).record)
    metrics = from_records(spark, records, kind="metrics")
    counters = delivery.queue_counters(delivery.queue_samples(metrics), "5 minutes").toPandas()
    assert counters["sent"].sum() == 50 + 9  # before: every step back and restart misread


def test_a_gateway_clock_ahead_is_measured_and_flagged_in_batch_and_stream(spark):
    """gw1's clock is 10 minutes ahead (its enqueue and send times too), gw2's is right: the lower envelope
    of receive - send says so; before, gw1's p50 read about -600 s and nothing said why."""
    from pipeline.jobs import delivery
    from pipeline.jobs.bronze import from_records

    ahead = [reading("gw1", "t1", n, n + 10, 20.0, 20.0, False, received_ms=at(n) + 800 + n * 10) for n in range(4)]
    right = [reading("gw2", "t2", n, n, 20.0, 20.0, False, latency_ms=900 + n) for n in range(4)]
    events = from_records(spark, [land(m).record for m in ahead + right])
    rows = {r.gateway_id: r for r in delivery.latency(events, "5 minutes").collect()}
    assert rows["gw1"].clock_offset_ms == -600_000 + 800 and rows["gw1"].clock_suspect
    assert rows["gw1"].latency_p50_ms < 0  # what was published; the report corrects it by the offset
    assert rows["gw2"].clock_offset_ms == 900 and not rows["gw2"].clock_suspect

    step = delivery.latency_step(WINDOW)
    frame = events.select("received_ms", "priority", "enqueued_ms", "sent_ms", "gateway_id").toPandas()
    out, _ = step(("gw1",), None, frame[frame["gateway_id"] == "gw1"])
    assert out["clock_offset_ms"].tolist() == [-600_000 + 800]


def test_a_clock_step_back_does_not_move_samples_into_earlier_windows():
    """Samples are windowed by the cloud's receive time: after a 10-minute step back, the gateway's ts_ms
    points into windows that were closed already (streaming had written them); receive time does not."""
    import pandas as pd

    from pipeline.jobs import delivery

    step = delivery.counter_step(WINDOW)
    rows = [("A", seq, at(20 + seq) if seq < 4 else at(10 + seq), at(20 + seq) + 300, 10 * seq) for seq in range(1, 9)]
    frame = pd.DataFrame(rows, columns=["boot", "seq", "sample_ms", "received_ms", "sent"])
    for name in ("expired", "dropped", "retries", "dead_lettered", "depth", "oldest_age_s"):
        frame[name] = 0
    out, _ = step(("gw1", "upstream", 5), None, frame)
    assert dict(zip(out["window_start_ms"], out["sent"], strict=True)) == {at(20): 40, at(25): 40}


def test_a_document_redelivered_into_a_later_step_adds_nothing():
    import pandas as pd

    from pipeline.jobs import delivery

    step = delivery.counter_step(WINDOW)

    def docs(*seqs):
        frame = pd.DataFrame([("A", s, at(20 + s), at(20 + s) + 300, 10 * s) for s in seqs],
                             columns=["boot", "seq", "sample_ms", "received_ms", "sent"])
        for name in ("expired", "dropped", "retries", "dead_lettered", "depth", "oldest_age_s"):
            frame[name] = 0
        return frame

    first, last = step(("gw1", "upstream", 5), None, docs(1, 2, 3))
    copy = docs(3).assign(received_ms=at(30))  # the same document, received again in a later window
    later, last = step(("gw1", "upstream", 5), last, pd.concat([copy, docs(6)], ignore_index=True))
    assert first["sent"].sum() + later["sent"].sum() == 60
    again, _ = step(("gw1", "upstream", 5), last, copy)  # once more, after seq 6
    assert again.empty  # before: 30 below 60 read as a restart, +30
