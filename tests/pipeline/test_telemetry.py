"""Telemetry parsing with the explicit schema, rejects with reasons, and first-copy deduplication."""

import json

import pytest

from pipeline.envelope import land
from tests.pipeline.pipeline_data import at, reading


def events_frame(spark, messages):
    from pipeline.jobs.bronze import from_records

    return from_records(spark, [land(m).record for m in messages])


def payload(**fields):
    base = {"temperature": 20.5, "set_point": 21.0, "heater": True, "device": "t1", "ts_ms": at(0)}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None}).encode()


CASES = [
    (payload(), None),
    (b"{not json", "payload is not a JSON object"),
    (b"[1, 2]", "payload is not a JSON object"),
    (payload(temperature="hot"), "temperature is missing or not a number"),
    (payload(set_point=None), "set_point is missing or not a number"),
    (payload(heater="on"), "heater is missing or not a boolean"),
    (payload(ts_ms=None), "ts_ms is missing or not an integer"),
    (payload(device=None), "device is missing or not a string"),
    (payload(device="t2"), "device 't2' does not match gw-device-id 't1'"),
    (payload(temperature=float("nan")), "temperature is not a finite number"),  # json.dumps writes NaN
    (payload(temperature=float("-inf")), "temperature is not a finite number"),
    (payload(set_point=float("inf")), "set_point is not a finite number"),
    (bytes([0xFF, 0xFE]), "payload is not UTF-8 text"),
]


def test_each_malformed_payload_gets_its_reason(spark):
    from pipeline.jobs import telemetry

    messages = [reading("gw1", "t1", n, 0, 0, 0, False, payload=body, content_type=None)
                for n, (body, _) in enumerate(CASES)]
    rows = telemetry.parse(events_frame(spark, messages)).select("message_id", "reason").collect()
    got = {row.message_id: row.reason for row in rows}
    assert got == {f"gw1:{n}": reason for n, (_, reason) in enumerate(CASES)}


def test_readings_and_rejects_split_the_telemetry(spark):
    from pipeline.jobs import telemetry

    messages = [reading("gw1", "t1", n, 0, 0, 0, False, payload=body, content_type=None)
                for n, (body, _) in enumerate(CASES)]
    alert = reading("gw1", "t1", 99, 0, 0, 0, False)  # another output: not telemetry, neither
    alert = type(alert)(alert.topic, alert.payload, alert.received_ms,
                        [(k, "alerts" if k == "gw-output" else v) for k, v in alert.user_properties])
    parsed = telemetry.parse(events_frame(spark, messages + [alert]))
    (good,) = telemetry.readings(parsed).collect()
    assert (good.temperature, good.set_point, good.heater, good.reading_ms) == (20.5, 21.0, True, at(0))
    rejects = telemetry.rejects(parsed).collect()
    assert len(rejects) == len(CASES) - 1
    assert {row.stage for row in rejects} == {"telemetry"}
    assert all(row.payload is not None or row.payload_base64 is not None for row in rejects)


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1)])
def test_batch_dedup_keeps_the_earliest_received_copy(spark, order):
    from pipeline.jobs.dedup import first_copies

    copies = [reading("gw1", "t1", 7, 0, 20.0, 20.0, False, received_ms=at(0) + delay, redelivered=delay > 0)
              for delay in (1_000, 30_000, 90_000)]
    frame = events_frame(spark, [copies[i] for i in order] + [reading("gw1", "t1", 8, 1, 20.0, 20.0, False)])
    rows = first_copies(frame).orderBy("message_id").collect()
    assert [(r.message_id, r.received_ms) for r in rows] == [("gw1:7", at(0) + 1_000), ("gw1:8", at(1) + 1_000)]
