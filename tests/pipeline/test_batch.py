"""The batch job over the sample landing zone: every output, with the values worked out by hand.

The sample is described in pipeline_data.py: t1 (priority 5, 1 s latency) and t2 (priority 2, 5 s).
"""

from pathlib import Path

import pytest

from tests.pipeline.pipeline_data import FLUSH_GATEWAY

pytestmark = pytest.mark.slow  # Spark jobs over the sample: seconds each


@pytest.fixture(scope="module")
def read(spark, batch_outputs):
    settings, _ = batch_outputs

    def read(name):
        frame = spark.read.parquet(settings.output(name))
        if "gateway_id" in frame.columns:
            frame = frame.where(~frame.gateway_id.eqNullSafe(FLUSH_GATEWAY))
        return frame.toPandas()

    return read


def test_outputs_are_written_partitioned_by_date(batch_outputs):
    settings, counts = batch_outputs
    assert set(counts) == {"rollups", "setpoint_changes", "delivery_latency", "queue_counters", "sla", "quarantine",
                           "firmware", "firmware_updates", "hil_summary", "hil_timeline"}
    assert (Path(settings.output("rollups")) / "date=2026-01-01").is_dir()
    assert (Path(settings.output("rollups")) / "date=2026-01-02").is_dir()  # the flush reading


def test_rollups_drop_the_duplicate_and_count_the_out_of_order_reading(read):
    rows = read("rollups").set_index(["device_id", read("rollups")["window_start"].dt.strftime("%H:%M")])
    t1 = rows.loc["t1"]
    assert t1["readings"].to_dict() == {"00:00": 5, "00:05": 5, "00:10": 6, "00:15": 3}
    assert t1.loc["00:00", ["temperature_min", "temperature_max", "set_point_last"]].tolist() == [19.0, 19.4, 21.0]
    assert t1.loc["00:00", "set_point_avg"] == pytest.approx(20.4)
    assert t1.loc["00:00", "heater_duty_cycle"] == pytest.approx(0.6)
    assert t1.loc["00:10", "temperature_avg"] == pytest.approx(121 / 6)
    assert t1.loc["00:10", "heater_duty_cycle"] == pytest.approx(4 / 6)
    assert t1.loc["00:10", "set_point_last"] == 22.0
    assert rows.loc["t2"]["readings"].to_dict() == {"00:00": 5, "00:05": 5, "00:10": 5, "00:15": 3}


def test_setpoint_change_log(read):
    rows = read("setpoint_changes").sort_values(["device_id", "changed_ms"])
    got = [(r.device_id, r.changed_at.strftime("%M:%S"), r.previous_set_point, r.set_point)
           for r in rows.fillna({"previous_set_point": -1}).itertuples()]
    assert got == [("t1", "00:00", -1, 20.0), ("t1", "03:00", 20.0, 21.0), ("t1", "14:00", 21.0, 22.0),
                   ("t2", "00:30", -1, 19.0)]


def test_sla_joins_latency_and_queue_outcomes(read):
    sla = read("sla")
    sla["window"] = sla["window_start"].dt.strftime("%H:%M")
    p5 = sla[sla["priority"] == 5].set_index("window")
    assert p5["delivered"].to_dict() == {"00:00": 5, "00:05": 8, "00:10": 6, "00:15": 3}  # rejects were delivered too
    assert p5["latency_p95_ms"].unique().tolist() == [1000]
    assert p5.loc["00:00", "queue_sent"] == 10
    assert p5.loc["00:05", ["queue_sent", "queue_expired", "queue_dropped", "queue_retries"]].tolist() == [15, 2, 1, 3]
    assert p5.loc["00:10", "queue_sent"] == 5  # restarted at 11: counted from zero
    p2 = sla[sla["priority"] == 2].set_index("window")
    assert p2["latency_p50_ms"].unique().tolist() == [5000]
    assert p2["queue_sent"].dropna().to_dict() == {"00:00": 4, "00:05": 5, "00:10": 1}


def test_quarantine_has_ingest_and_telemetry_rejects_with_reasons(read):
    rows = read("quarantine").sort_values(["stage", "message_id"])
    assert [(r.stage, r.message_id, r.reason) for r in rows.fillna({"message_id": "-"}).itertuples()] == [
        ("ingest", "-", "missing user properties: gw-message-id, gw-device-id, gw-priority, gw-enqueued-ms, gw-sent-ms, gw-ttl-s"),
        ("telemetry", "gw1:901", "payload is not a JSON object"),
        ("telemetry", "gw1:902", "temperature is missing or not a number"),
        ("telemetry", "gw1:903", "device 't2' does not match gw-device-id 't1'"),
    ]
