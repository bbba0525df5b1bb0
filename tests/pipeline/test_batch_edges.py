"""Batch on landing zones that broke it: nothing to quarantine, non-finite readings, lines cut short,
rejects redelivered. Every case is held to the independent DuckDB computation (duckdb_reference.py)."""

import json
import math
import random
import string

import duckdb
import pandas as pd
import pyarrow.dataset as ds
import pytest

from pipeline.envelope import Incoming
from pipeline.jobs.batch import run_batch
from pipeline.jobs.settings import JobSettings
from pipeline.report import read_output, render_report
from tests.pipeline import duckdb_reference
from tests.pipeline.pipeline_data import at, metrics, reading, write_batch

OUTPUTS = {"rollups", "setpoint_changes", "delivery_latency", "queue_counters", "sla", "quarantine", "firmware",
           "firmware_updates"}


def run(spark, landing, out, **options):
    settings = JobSettings(str(landing), str(out), **options)
    return settings, run_batch(spark, settings, progress=lambda _: None)


def spark_rollups(spark, settings):
    frame = spark.read.parquet(settings.output("rollups")).toPandas()
    frame["window_start_ms"] = (frame["window_start"] - pd.Timestamp(0)) // pd.Timedelta(milliseconds=1)
    columns = ["gateway_id", "device_id", "window_start_ms", "readings", "temperature_min", "temperature_avg",
               "temperature_max", "set_point_avg", "set_point_last", "heater_duty_cycle"]
    return duckdb_reference.comparable(frame[columns])


def spark_quarantine(spark, settings):
    frame = spark.read.parquet(settings.output("quarantine")).toPandas()
    return duckdb_reference.comparable(frame[["stage", "reason", "message_id", "received_ms"]])


def assert_matches_duckdb(spark, settings):
    con = duckdb_reference.connect(settings.landing)
    pd.testing.assert_frame_equal(spark_rollups(spark, settings), duckdb_reference.rollups(con), check_dtype=False)
    pd.testing.assert_frame_equal(spark_quarantine(spark, settings), duckdb_reference.quarantine(con),
                                  check_dtype=False)


def minutes(gateway, device, count, first_seq=1):
    return [reading(gateway, device, first_seq + m, m, 20.0 + m / 10, 21.0, m % 2 == 0) for m in range(count)]


@pytest.mark.parametrize("zone", ["clean", "empty"])
def test_a_zone_with_nothing_to_quarantine_writes_every_output_with_its_schema(spark, tmp_path, zone):
    landing = tmp_path / "landing"
    landing.mkdir()
    if zone == "clean":  # readings, no metrics, nothing malformed
        write_batch(landing, minutes("gw1", "t1", 12), 0)
    settings, counts = run(spark, landing, tmp_path / "out")

    assert set(counts) == OUTPUTS
    assert counts["quarantine"] == 0
    assert (counts["rollups"] > 0) == (zone == "clean")
    for name in OUTPUTS:
        written = spark.read.parquet(settings.output(name))  # schema from the files, not given
        assert "date" in written.columns and written.count() == counts[name], name
        assert set(ds.dataset(settings.output(name), format="parquet", partitioning="hive").schema.names) == set(
            written.columns), name
        found = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{settings.output(name)}/**/*.parquet')").fetchone()
        assert found == (counts[name],), name
    render_report(settings.out, tmp_path / "report")
    assert_matches_duckdb(spark, settings)


def test_an_empty_output_takes_data_on_the_next_run(spark, tmp_path):
    landing = tmp_path / "landing"
    write_batch(landing, minutes("gw1", "t1", 3), 0)
    settings, counts = run(spark, landing, tmp_path / "out")
    assert counts["quarantine"] == 0
    write_batch(landing, [reading("gw1", "t1", 99, 1, 0, 0, False, payload=b"{not json")], 1)
    settings, counts = run(spark, landing, tmp_path / "out")
    assert counts["quarantine"] == 1
    assert spark.read.parquet(settings.output("quarantine")).count() == 1  # no schema-only file left beside


def non_finite(seq, minute, **fields):
    body = {"temperature": 20.0, "set_point": 21.0, "heater": True, "device": "t1", "ts_ms": at(minute)}
    body.update(fields)
    return reading("gw1", "t1", seq, minute, 0, 0, False, payload=json.dumps(body).encode())


def test_non_finite_readings_are_quarantined_not_averaged(spark, tmp_path):
    landing = tmp_path / "landing"
    write_batch(landing, minutes("gw1", "t1", 10) + [
        non_finite(101, 1.5, temperature=math.nan),
        non_finite(102, 2.5, temperature=math.inf),
        non_finite(103, 6.5, temperature=-math.inf),
        non_finite(104, 7.5, set_point=math.nan),
        non_finite(105, 8.5, set_point=-math.inf, temperature=math.nan),
    ], 0)
    settings, counts = run(spark, landing, tmp_path / "out")

    rollups = spark_rollups(spark, settings)
    assert rollups["readings"].tolist() == [5, 5]
    assert rollups[["temperature_avg", "temperature_max", "set_point_avg"]].map(math.isfinite).all().all()
    reasons = spark_quarantine(spark, settings).set_index("message_id")["reason"].to_dict()
    assert reasons == {
        "gw1:101": "temperature is not a finite number", "gw1:102": "temperature is not a finite number",
        "gw1:103": "temperature is not a finite number", "gw1:104": "set_point is not a finite number",
        "gw1:105": "temperature is not a finite number",
    }
    assert_matches_duckdb(spark, settings)


def test_lines_cut_short_are_quarantined_and_counted(spark, tmp_path):
    landing = tmp_path / "landing"
    write_batch(landing, minutes("gw1", "t1", 10) + [metrics("gw1", 1, {5: {"sent": 3}})], 0)
    (events_file,) = landing.glob("events/*/*/*.jsonl")
    whole = events_file.read_text().splitlines(keepends=True)
    events_file.write_text("".join(whole) + whole[3][:57])  # a copy interrupted in the last line
    (metrics_file,) = landing.glob("metrics/*/*/*.jsonl")
    metrics_file.write_text(metrics_file.read_text() + '{"message_id": "x"}\n' + "not json at all\n")
    settings, counts = run(spark, landing, tmp_path / "out")

    landing_rejects = spark_quarantine(spark, settings).query("stage == 'landing'")
    assert landing_rejects["reason"].tolist() == [
        "landing line is not a JSON record (cut short?)", "landing line is not a JSON record (cut short?)",
        "landing record has no received_ms"]
    assert set(landing_rejects["received_ms"]) == {at(0)}  # the start of the files' hour partition
    assert counts["quarantine"] == 3
    assert spark_rollups(spark, settings)["readings"].sum() == 10
    raw = spark.read.parquet(settings.output("quarantine")).where("stage = 'landing'").toPandas()
    assert whole[3][:57] in raw["payload"].tolist()  # kept raw, to replay
    assert_matches_duckdb(spark, settings)


def test_a_redelivered_reject_is_quarantined_once(spark, tmp_path):
    landing = tmp_path / "landing"
    bad_json = reading("gw1", "t1", 7, 0, 0, 0, False, payload=b"{oops")
    no_ids = Incoming("gateways/gw1/devices/t1/messages/events", b"{}", at(1), [("gw-gateway-id", "gw1")])
    other = Incoming("gateways/gw1/devices/t1/messages/events", b"{ }", at(1), [("gw-gateway-id", "gw1")])

    def again(message, delay_ms):
        return Incoming(message.topic, message.payload, message.received_ms + delay_ms, message.user_properties,
                        message.content_type, True)

    write_batch(landing, minutes("gw1", "t1", 3) + [bad_json, no_ids, other, again(no_ids, 100)], 0)
    write_batch(landing, [again(bad_json, 60_000), again(no_ids, 60_000)], 1)
    settings, counts = run(spark, landing, tmp_path / "out")

    rejects = spark_quarantine(spark, settings)
    assert counts["quarantine"] == 3
    assert sorted(rejects["received_ms"]) == [at(0) + 1_000, at(1), at(1)]  # the first copies
    assert_matches_duckdb(spark, settings)
    assert len(read_output(settings.out, "quarantine")) == 3  # what the report counts


def test_any_cut_of_a_line_and_any_garbage_line_is_quarantined_never_lost_never_fatal(spark, tmp_path):
    """Hostile landing files: every cut of a real record line and random printable junk, one run."""
    landing = tmp_path / "landing"
    write_batch(landing, minutes("gw1", "t1", 10), 0)
    (events_file,) = landing.glob("events/*/*/*.jsonl")
    line = events_file.read_text().splitlines()[4]
    rng = random.Random(17)
    alphabet = string.printable.replace("\n", "").replace("\r", "").replace("\x0b", "").replace("\x0c", "")
    junk = ["x" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(25)]
    junk += ["{}", "42", '"text"', "null", "[]", "[" + line + "," + line + "]", "\t"]  # an array is one line too
    cuts = [line[:k] for k in range(1, len(line), 9)]
    with events_file.open("a") as handle:
        handle.write("".join(text + "\n" for text in cuts + junk))
    settings, counts = run(spark, landing, tmp_path / "out")

    landing_rejects = spark_quarantine(spark, settings).query("stage == 'landing'")
    assert len(landing_rejects) == len(cuts) + len(junk)
    assert spark_rollups(spark, settings)["readings"].sum() == 10
    assert_matches_duckdb(spark, settings)


def test_an_output_counts_the_rows_it_wrote_without_reading_them_back(spark, tmp_path):
    """A ranged run replaces some ``date`` partitions and keeps the others: its count is what it wrote."""
    from pyspark.sql import functions as F

    from pipeline.jobs.output import write_output

    rows = spark.range(10).withColumn("date", F.when(F.col("id") < 7, "2026-01-01").otherwise("2026-01-02"))
    assert write_output(spark, rows, str(tmp_path / "out")) == 10
    assert write_output(spark, rows.where("id >= 7"), str(tmp_path / "out"), dynamic=True) == 3
    assert spark.read.parquet(str(tmp_path / "out")).count() == 10  # 01-01 kept as it was
    assert write_output(spark, rows.limit(0), str(tmp_path / "empty")) == 0
