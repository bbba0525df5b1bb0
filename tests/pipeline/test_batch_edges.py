"""Batch on landing zones that broke it: nothing to quarantine, non-finite readings, lines cut short,
rejects redelivered. Every case is held to the independent DuckDB computation (duckdb_reference.py).

A batch run over a landing zone of a few rows costs the same as over one many times its size (seconds of
planning and scheduling per output; the rows are nothing), so the hostile zones are one landing zone, one
run: each zone lands in an hour of its own from its own gateway (``HOSTILE_ZONES``), and what each zone
asks of the outputs is read from its rows alone (its hour's quarantine, its gateway's rollups), as
test_first_events does with its zones.
"""

import json
import math
import random
import string

from pipeline.envelope import Incoming
from pipeline.jobs.settings import JobSettings
from tests.pipeline import duckdb_reference
from tests.pipeline.pipeline_data import MINUTE, T0, at, metrics, reading, write_batch

OUTPUTS = {"rollups", "setpoint_changes", "delivery_latency", "queue_counters", "sla", "quarantine", "firmware",
           "firmware_updates"}
HOUR = 60  # minutes


def run(spark, landing, out, **options):
    from pipeline.jobs.batch import run_batch

    settings = JobSettings(str(landing), str(out), **options)
    return settings, run_batch(spark, settings, progress=lambda _: None)


def spark_rollups(spark, settings):
    import pandas as pd

    frame = spark.read.parquet(settings.output("rollups")).toPandas()
    frame["window_start_ms"] = (frame["window_start"] - pd.Timestamp(0)) // pd.Timedelta(milliseconds=1)
    columns = ["gateway_id", "device_id", "window_start_ms", "readings", "temperature_min", "temperature_avg",
               "temperature_max", "set_point_avg", "set_point_last", "heater_duty_cycle"]
    return duckdb_reference.comparable(frame[columns])


def spark_quarantine(spark, settings):
    frame = spark.read.parquet(settings.output("quarantine")).toPandas()
    return duckdb_reference.comparable(frame[["stage", "reason", "message_id", "received_ms"]])


def assert_matches_duckdb(spark, settings, landing=None, *, rollups=None, quarantine=None):
    """The rollups and the quarantine equal DuckDB's over ``landing`` (the run's own, by default). A caller
    that has read them already (``spark_rollups``, ``spark_quarantine``) passes them: each read is a Spark job."""
    import pandas as pd

    con = duckdb_reference.connect(landing or settings.landing)
    rollups = spark_rollups(spark, settings) if rollups is None else rollups
    quarantine = spark_quarantine(spark, settings) if quarantine is None else quarantine
    pd.testing.assert_frame_equal(rollups, duckdb_reference.rollups(con), check_dtype=False)
    pd.testing.assert_frame_equal(quarantine, duckdb_reference.quarantine(con), check_dtype=False)


def minutes(gateway, device, count, first_seq=1, hour=0):
    return [reading(gateway, device, first_seq + m, hour * HOUR + m, 20.0 + m / 10, 21.0, m % 2 == 0)
            for m in range(count)]


def test_an_empty_zone_and_then_a_zone_with_nothing_to_quarantine_write_every_output_with_its_schema(spark, tmp_path):
    """An empty landing zone writes every output, each empty with its schema; the same zone with readings
    and nothing malformed, in the next run, writes them again: the empty outputs take data, the quarantine
    stays empty with its schema. Every output is read back by Spark, pyarrow and DuckDB each time. (One
    zone, two runs: a batch run costs seconds of planning whatever its rows.)"""
    import duckdb
    import pyarrow.dataset as ds

    from pipeline.report import render_report

    landing = tmp_path / "landing"
    landing.mkdir()
    for zone in ("empty", "clean"):
        if zone == "clean":  # readings, no metrics, nothing malformed
            write_batch(landing, minutes("gw1", "t1", 12), 0)
        settings, counts = run(spark, landing, tmp_path / "out")

        assert set(counts) == OUTPUTS, zone
        assert counts["quarantine"] == 0, zone
        assert (counts["rollups"] > 0) == (zone == "clean")
        for name in OUTPUTS:
            written = spark.read.parquet(settings.output(name))  # schema from the files, not given
            assert "date" in written.columns and written.count() == counts[name], (zone, name)
            assert set(ds.dataset(settings.output(name), format="parquet", partitioning="hive").schema.names) == set(
                written.columns), (zone, name)
            found = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{settings.output(name)}/**/*.parquet')").fetchone()
            assert found == (counts[name],), (zone, name)
        render_report(settings.out, tmp_path / "report")
        assert_matches_duckdb(spark, settings)


# -- the hostile zones, one landing zone and one run ------------------------------------------------------
#: Zone name -> (its hour of the landing zone, its gateway). Message ids are ``<gateway>:<seq>``, so the
#: zones' ids never meet; every row a zone lands is received within its hour.
HOSTILE_ZONES = {"non-finite": (0, "gwn"), "cut short": (1, "gwc"), "redelivered": (2, "gwr"), "fuzz": (3, "gwf")}


def zone_of(received_ms: int) -> str | None:
    """The zone whose hour ``received_ms`` falls in."""
    hours = {hour: name for name, (hour, _) in HOSTILE_ZONES.items()}
    return hours.get((received_ms - T0) // (HOUR * MINUTE))


def non_finite(gateway, seq, minute, **fields):
    body = {"temperature": 20.0, "set_point": 21.0, "heater": True, "device": "t1", "ts_ms": at(minute)}
    body.update(fields)
    return reading(gateway, "t1", seq, minute, 0, 0, False, payload=json.dumps(body).encode())


def non_finite_zone(hour, gateway):
    """Ten minutes of readings and five with NaN or an infinity in a reading's number."""
    return minutes(gateway, "t1", 10, hour=hour) + [
        non_finite(gateway, 101, hour * HOUR + 1.5, temperature=math.nan),
        non_finite(gateway, 102, hour * HOUR + 2.5, temperature=math.inf),
        non_finite(gateway, 103, hour * HOUR + 6.5, temperature=-math.inf),
        non_finite(gateway, 104, hour * HOUR + 7.5, set_point=math.nan),
        non_finite(gateway, 105, hour * HOUR + 8.5, set_point=-math.inf, temperature=math.nan),
    ]


def redelivered_zone(hour, gateway):
    """Rejects with and without ids, landed twice or three times: (the first batch, the second)."""
    bad_json = reading(gateway, "t1", 7, hour * HOUR, 0, 0, False, payload=b"{oops")
    no_ids = Incoming(f"gateways/{gateway}/devices/t1/messages/events", b"{}", at(hour * HOUR + 1),
                      [("gw-gateway-id", gateway)])
    other = Incoming(f"gateways/{gateway}/devices/t1/messages/events", b"{ }", at(hour * HOUR + 1),
                     [("gw-gateway-id", gateway)])

    def again(message, delay_ms):
        return Incoming(message.topic, message.payload, message.received_ms + delay_ms, message.user_properties,
                        message.content_type, True)

    return (minutes(gateway, "t1", 3, hour=hour) + [bad_json, no_ids, other, again(no_ids, 100)],
            [again(bad_json, 60_000), again(no_ids, 60_000)])


def test_hostile_zones_are_quarantined_never_averaged_never_lost_never_fatal(spark, tmp_path):
    """Non-finite readings are quarantined, not averaged; lines cut short are quarantined and counted; a
    redelivered reject is quarantined once; any cut of a real record line and random printable junk is
    quarantined, never lost, never fatal. One run over the four zones."""
    from pipeline.report import read_output

    landing = tmp_path / "landing"
    zone = {name: hour for name, (hour, _) in HOSTILE_ZONES.items()}
    gateway = {name: gw for name, (_, gw) in HOSTILE_ZONES.items()}
    redelivered_first, redelivered_again = redelivered_zone(zone["redelivered"], gateway["redelivered"])
    write_batch(landing, non_finite_zone(zone["non-finite"], gateway["non-finite"])
                + minutes(gateway["cut short"], "t1", 10, hour=zone["cut short"])
                + [metrics(gateway["cut short"], zone["cut short"] * HOUR + 1, {5: {"sent": 3}})]
                + redelivered_first + minutes(gateway["fuzz"], "t1", 10, hour=zone["fuzz"]), 0)
    write_batch(landing, redelivered_again, 1)

    def landed(kind, name):
        (path,) = landing.glob(f"{kind}/date=*/hour={zone[name]:02d}/*.jsonl")
        return path

    # cut short: a copy interrupted in the events' last line, metrics lines without received_ms or JSON
    events_file = landed("events", "cut short")
    whole = events_file.read_text().splitlines(keepends=True)
    events_file.write_text("".join(whole) + whole[3][:57])
    metrics_file = landed("metrics", "cut short")
    metrics_file.write_text(metrics_file.read_text() + '{"message_id": "x"}\n' + "not json at all\n")
    # fuzz: every 9th cut of a real record line and random printable junk
    events_file = landed("events", "fuzz")
    line = events_file.read_text().splitlines()[4]
    rng = random.Random(17)
    alphabet = string.printable.replace("\n", "").replace("\r", "").replace("\x0b", "").replace("\x0c", "")
    junk = ["x" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(25)]
    junk += ["{}", "42", '"text"', "null", "[]", "[" + line + "," + line + "]", "\t"]  # an array is one line too
    cuts = [line[:k] for k in range(1, len(line), 9)]
    with events_file.open("a") as handle:
        handle.write("".join(text + "\n" for text in cuts + junk))

    settings, counts = run(spark, landing, tmp_path / "out")

    rejects = spark_quarantine(spark, settings)
    rejects_of = {name: rejects[rejects["received_ms"].map(zone_of) == name] for name in HOSTILE_ZONES}
    rollups = spark_rollups(spark, settings)
    rollups_of = {name: rollups[rollups["gateway_id"] == gw] for name, gw in gateway.items()}

    # non-finite readings are quarantined, not averaged
    assert rollups_of["non-finite"]["readings"].tolist() == [5, 5]
    assert rollups_of["non-finite"][["temperature_avg", "temperature_max", "set_point_avg"]].map(math.isfinite).all().all()
    gwn = gateway["non-finite"]
    assert rejects_of["non-finite"].set_index("message_id")["reason"].to_dict() == {
        f"{gwn}:101": "temperature is not a finite number", f"{gwn}:102": "temperature is not a finite number",
        f"{gwn}:103": "temperature is not a finite number", f"{gwn}:104": "set_point is not a finite number",
        f"{gwn}:105": "temperature is not a finite number",
    }

    # lines cut short are quarantined and counted
    cut_short = rejects_of["cut short"]
    assert cut_short["stage"].tolist() == ["landing"] * 3
    assert cut_short["reason"].tolist() == [
        "landing line is not a JSON record (cut short?)", "landing line is not a JSON record (cut short?)",
        "landing record has no received_ms"]
    assert set(cut_short["received_ms"]) == {at(zone["cut short"] * HOUR)}  # the start of the files' hour partition
    assert rollups_of["cut short"]["readings"].sum() == 10
    raw = spark.read.parquet(settings.output("quarantine")).where("stage = 'landing'").toPandas()
    assert whole[3][:57] in raw["payload"].tolist()  # kept raw, to replay

    # a redelivered reject is quarantined once
    h = zone["redelivered"] * HOUR
    assert sorted(rejects_of["redelivered"]["received_ms"]) == [at(h) + 1_000, at(h + 1), at(h + 1)]  # the first copies
    reported = read_output(settings.out, "quarantine")  # what the report counts
    assert sum(reported["received_ms"].map(zone_of) == "redelivered") == 3

    # any cut of a line and any garbage line is quarantined, never lost, never fatal
    fuzz = rejects_of["fuzz"]
    assert (fuzz["stage"] == "landing").all() and len(fuzz) == len(cuts) + len(junk)
    assert rollups_of["fuzz"]["readings"].sum() == 10

    assert counts["quarantine"] == len(rejects) == 5 + 3 + 3 + len(cuts) + len(junk)  # and nothing else
    assert_matches_duckdb(spark, settings, rollups=rollups, quarantine=rejects)


def test_an_output_counts_the_rows_it_wrote_without_reading_them_back(spark, tmp_path):
    """A ranged run replaces some ``date`` partitions and keeps the others: its count is what it wrote."""
    from pyspark.sql import functions as F

    from pipeline.jobs.output import write_output

    rows = spark.range(10).withColumn("date", F.when(F.col("id") < 7, "2026-01-01").otherwise("2026-01-02"))
    assert write_output(spark, rows, str(tmp_path / "out")) == 10
    assert write_output(spark, rows.where("id >= 7"), str(tmp_path / "out"), dynamic=True) == 3
    assert spark.read.parquet(str(tmp_path / "out")).count() == 10  # 01-01 kept as it was
    assert write_output(spark, rows.limit(0), str(tmp_path / "empty")) == 0
