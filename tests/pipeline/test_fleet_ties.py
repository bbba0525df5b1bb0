"""A gateway clock stepped back by a whole number of reading periods gives a thermostat two readings with
the same reading time (10 minutes back at a reading a minute: the reading at 01:30:20 is stamped 01:20:20,
like the one taken then). Every output orders such readings one way, the change log's (reading time, then
message id), so batch gives the same rows on every run and streaming's fold the same as batch."""

import json

import pytest

from pipeline.envelope import Incoming
from tests.pipeline.pipeline_data import MINUTE, T0, gateway_properties, write_batch


def stamped(seq: int, ts: int, set_point: float, received_ms: int) -> Incoming:
    doc = {"device": "t1", "temperature": 20.0 + seq, "set_point": set_point, "heater": False, "ts_ms": ts}
    return Incoming("gateways/gwT/devices/t1/messages/events", json.dumps(doc).encode(), received_ms,
                    gateway_properties("gwT", "t1", seq, enqueued_ms=ts), "application/json")


@pytest.mark.slow  # a batch run
def test_set_point_last_of_readings_stamped_alike_follows_the_change_logs_order(spark, tmp_path):
    from pipeline.jobs.batch import build
    from pipeline.jobs.settings import JobSettings

    ts = T0 + 20 * MINUTE + 20_000
    # gwT:10 (taken 10 minutes later, after the step back) is last in the file; gwT:9 sorts after it
    write_batch(tmp_path / "landing", [stamped(9, ts, 21.0, ts + 500), stamped(10, ts, 22.0, ts + 10 * MINUTE + 500)], 0)
    outputs = build(spark, JobSettings(str(tmp_path / "landing"), str(tmp_path / "out")))
    (window,) = outputs["rollups"].collect()
    changes = outputs["setpoint_changes"].orderBy("changed_ms", "message_id").collect()
    assert [(c.message_id, c.set_point) for c in changes] == [("gwT:10", 22.0), ("gwT:9", 21.0)]
    assert window.set_point_last == changes[-1].set_point == 21.0  # before: 22.0, the last in the file
