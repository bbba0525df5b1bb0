"""Firmware update status as its own kind end to end: the updater's messages (output ``update``, or
``data`` without ``ts_ms`` from older firmware) land as the ``firmware`` kind, not as bad readings, and
batch turns them and the readings' ``fw`` into the fleet's firmware log and its updates."""

import json

import pytest

from pipeline.envelope import Incoming, land
from pipeline.records import EVENTS, FIRMWARE
from tests.pipeline.pipeline_data import MINUTE, at, gateway_properties, write_batch


def status(device, seq, minute, fw, state, version, reason=None, output="update", gateway="gw1"):
    """An updater status message, enqueued on the gateway at ``minute``."""
    doc = {"device": device, "fw": fw, "registered": False, "temperature": 20.5, "set_point": 21.0, "heater": False,
           "mem_free": 16000, "update": {"state": state, "version": version, "file": "app.mpy", "offset": 4096,
                                         "reason": reason}}
    return Incoming(f"gateways/{gateway}/devices/{device}/messages/events", json.dumps(doc).encode(), at(minute) + 500,
                    gateway_properties(gateway, device, seq, enqueued_ms=at(minute), output=output), "application/json")


def reading_on(device, seq, minute, fw, update=None, gateway="gw1"):
    doc = {"device": device, "temperature": 20.0, "set_point": 21.0, "heater": False, "ts_ms": at(minute), "fw": fw,
           "update": update}
    return Incoming(f"gateways/{gateway}/devices/{device}/messages/events", json.dumps(doc).encode(), at(minute) + 500,
                    gateway_properties(gateway, device, seq, enqueued_ms=at(minute)), "application/json")


def test_update_status_lands_as_its_own_kind_and_readings_stay_events():
    assert land(status("t1", 1, 0, "0.1.0", "downloading", "0.2.0")).kind == FIRMWARE
    assert land(status("t1", 2, 0, "0.1.0", "downloading", "0.2.0", output="data")).kind == FIRMWARE  # older firmware
    assert land(reading_on("t1", 3, 0, "0.1.0")).kind == EVENTS
    assert land(reading_on("t1", 4, 0, "0.1.0", {"state": "refused", "version": "0.2.0", "reason": "bad"})).kind == EVENTS


def fleet():
    t1 = [reading_on("t1", n, n, "0.1.0") for n in range(3)]
    t1 += [status("t1", 10 + n, 3 + n / 10, "0.1.0", "downloading", "0.2.0") for n in range(4)]
    t1 += [status("t1", 10, 3, "0.1.0", "downloading", "0.2.0")]  # a copy
    t1 += [reading_on("t1", 20 + n, 4 + n, "0.2.0") for n in range(3)]
    t2 = [reading_on("t2", 100 + n, n, "0.1.0") for n in range(2)]
    t2 += [status("t2", 110, 2.5, "0.1.0", "downloading", "0.3.0", output="data")]  # older firmware's output
    t2 += [reading_on("t2", 120 + n, 3 + n, "0.1.0", {"state": "rolled_back", "version": "0.3.0",
                                                       "reason": "trial boot failed: ImportError"}) for n in range(2)]
    return t1 + t2


@pytest.mark.slow  # a batch run
def test_batch_writes_the_fleets_firmware_and_updates(spark, tmp_path):
    from pipeline.jobs.batch import run_batch
    from pipeline.jobs.settings import JobSettings

    landing = tmp_path / "landing"
    write_batch(landing, fleet(), 0)
    settings = JobSettings(str(landing), str(tmp_path / "out"))
    counts = run_batch(spark, settings, progress=lambda _: None)
    assert counts["quarantine"] == 0  # before: every updater message was a bad reading
    updates = {r.device_id: r for r in spark.read.parquet(settings.output("firmware_updates")).collect()}
    t1, t2 = updates["t1"], updates["t2"]
    assert (t1.version, t1.from_version, t1.outcome, t1.started_ms, t1.finished_ms, t1.duration_ms) == (
        "0.2.0", "0.1.0", "installed", at(3), at(4), MINUTE)
    assert (t2.version, t2.outcome, t2.reason, t2.started_ms, t2.finished_ms) == (
        "0.3.0", "rolled_back", "trial boot failed: ImportError", at(2.5), at(3))  # first reported
    log = spark.read.parquet(settings.output("firmware")).where("device_id = 't1'").orderBy("at_ms").collect()
    assert [(r.running, r.update_state) for r in log] == [("0.1.0", None), ("0.1.0", "downloading"), ("0.2.0", None)]
    assert counts["rollups"] > 0

    from pipeline.report import render_report

    page = render_report(settings.out, tmp_path / "report").read_text()
    assert "Firmware" in page and "rolled_back" in page and "trial boot failed: ImportError" in page
    assert "img/firmware-versions.png" in page
