"""What the ingest lands, and what it quarantines with which reason (no broker, no Spark)."""

import json

import pytest

from pipeline.envelope import (
    EVENTS,
    LANDING_FIELDS,
    METRICS,
    QUARANTINE,
    Incoming,
    decode_payload,
    land,
)
from tests.pipeline.pipeline_data import gateway_properties, metrics, reading


def test_event_lands_with_gateway_properties_and_keeps_device_properties():
    message = reading("gw1", "t1", 7, 0, 21.5, 22.0, True, priority=3)
    message = Incoming(message.topic, message.payload, message.received_ms,
                       message.user_properties + [("firmware", "1.2")], message.content_type)
    landed = land(message)
    assert landed.kind == EVENTS
    record = landed.record
    assert list(record) == list(LANDING_FIELDS)
    assert (record["message_id"], record["gateway_id"], record["device_id"], record["output"]) == ("gw1:7", "gw1", "t1", "data")
    assert record["priority"] == 3 and record["ttl_s"] == 3600 and record["enqueued_ms"] == record["sent_ms"]
    assert record["properties"] == {"firmware": "1.2"}
    assert json.loads(record["payload"])["temperature"] == 21.5 and record["reason"] is None


def test_a_route_without_priority_lands_as_priority_10():
    """The gateway sends gw-priority 10 for routes without a priority (docs/message-format.md)."""
    landed = land(reading("gw1", "t1", 8, 0, 21.0, 22.0, False, priority=10))
    assert landed.kind == EVENTS and landed.record["priority"] == 10


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda props: [p for p in props if p[0] != "gw-priority"], "missing user properties: gw-priority"),
        (lambda props: [p for p in props if p[0] not in ("gw-message-id", "gw-sent-ms")],
         "missing user properties: gw-message-id, gw-sent-ms"),
        (lambda props: [(k, "soon" if k == "gw-enqueued-ms" else v) for k, v in props],
         "user property gw-enqueued-ms is not an integer: 'soon'"),
        (lambda props: [(k, "12" if k == "gw-priority" else v) for k, v in props], "gw-priority out of range 0-10: 12"),
        # The gateway always sends gw-ttl-s (docs/message-format.md): a message without it did not come from one.
        (lambda props: [p for p in props if p[0] != "gw-ttl-s"], "missing user properties: gw-ttl-s"),
        (lambda props: [(k, "1h" if k == "gw-ttl-s" else v) for k, v in props],
         "user property gw-ttl-s is not an integer: '1h'"),
    ],
)
def test_bad_envelope_is_quarantined_with_the_reason(change, reason):
    good = reading("gw1", "t1", 1, 0, 20.0, 20.0, False)
    landed = land(Incoming(good.topic, good.payload, good.received_ms, change(good.user_properties), good.content_type))
    assert landed.kind == QUARANTINE
    assert landed.record["reason"] == reason
    assert landed.record["payload"] == good.payload.decode()  # kept raw, to replay once fixed


def test_json_content_that_does_not_parse_is_quarantined():
    landed = land(reading("gw1", "t1", 1, 0, 0, 0, False, payload=b'{"temperature": '))
    assert landed.kind == QUARANTINE
    assert landed.record["reason"].startswith("payload is not valid JSON")
    assert landed.record["message_id"] == "gw1:1"


def test_binary_payload_without_content_type_lands_as_base64():
    raw = bytes(range(256))
    landed = land(reading("gw1", "cam", 1, 0, 0, 0, False, payload=raw, content_type=None))
    assert landed.kind == EVENTS
    assert landed.record["payload"] is None
    assert decode_payload(landed.record) == raw


def test_metrics_message_is_named_by_gateway_and_time():
    landed = land(metrics("gw1", 1, {5: {"depth": 1}}))
    assert landed.kind == METRICS
    assert landed.record["message_id"] == f"gw1:metrics:{landed.record['sent_ms']}"
    assert landed.record["gateway_id"] == "gw1"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"[]", "metrics payload is not a JSON object"),
        (b'{"gateway_id": "gw1", "endpoints": {}}', "metrics payload has no integer ts_ms"),
        (b'{"gateway_id": "gw1", "ts_ms": 5}', "metrics payload has no endpoints object"),
        (b"\xff", "payload is not UTF-8"),
        # Python's json.dumps writes these; a counter or gauge that is not a number would read as a reset.
        (b'{"gateway_id": "gw1", "ts_ms": 5, "endpoints": {"upstream": {"0": {"depth": NaN}}}}',
         "metrics payload has a number that is not finite: NaN"),
        (b'{"gateway_id": "gw1", "ts_ms": 5, "endpoints": {"upstream": {"0": {"oldest_age_s": -Infinity}}}}',
         "metrics payload has a number that is not finite: -Infinity"),
    ],
)
def test_bad_metrics_are_quarantined(payload, reason):
    landed = land(Incoming("gateways/gw1/metrics", payload, 1))
    assert (landed.kind, landed.record["reason"]) == (QUARANTINE, reason)


def test_every_kind_has_every_landing_field():
    props = gateway_properties("gw1", "t1", 1, enqueued_ms=1)
    for message in (Incoming("gateways/gw1/devices/t1/messages/events", b"x", 1, props),
                    Incoming("gateways/gw1/devices/t1/messages/events", b"x", 1, []),
                    metrics("gw1", 0, {})):
        assert list(land(message).record) == list(LANDING_FIELDS)


def test_spark_landing_schema_mirrors_the_envelope():
    from pipeline.jobs.schemas import LANDING

    assert LANDING.fieldNames() == list(LANDING_FIELDS)
