"""Upstream batches at the ingest: each message lands as its one-message PUBLISH would (no broker, no Spark)."""

import base64

import pytest

from pipeline.envelope import (
    EVENTS,
    LANDING_FIELDS,
    METRICS,
    QUARANTINE,
    Incoming,
    decode_payload,
    land,
    land_all,
    land_batch,
)
from tests.pipeline.pipeline_data import (
    at,
    batch_publish,
    metrics,
    queued,
    reading,
    single_publish,
)

SENT = at(3)
RECEIVED = at(3) + 700


def mixed_items():
    """Three sources and a binary payload: two thermostats, a module output, a camera without content type."""
    return [
        queued("t1", 101, 0, properties=(("firmware", "1.2"), ("unit", "C"))),
        queued("t2", 102, 0.5),
        queued("t1", 103, 1, properties=(("firmware", "1.2"), ("unit", "C"))),
        queued("gw1", 105, 1.5, module="filter", output="clean", ttl_s=60),
        queued("cam", 110, 2, payload=bytes(range(256)), output=None, content_type=None, ttl_s=0),
    ]


def one_message_records(items, **options):
    return [land(single_publish("gw1", item, sent_ms=SENT, received_ms=RECEIVED, **options)) for item in items]


def test_each_message_of_a_batch_lands_exactly_as_its_one_message_publish():
    items = mixed_items()
    landed = land_all(batch_publish("gw1", items, sent_ms=SENT, received_ms=RECEIVED))
    expected = one_message_records(items)
    assert [one.kind for one in landed] == [EVENTS] * len(items) == [one.kind for one in expected]
    for got, want in zip(landed, expected, strict=True):
        assert list(got.record) == list(LANDING_FIELDS)
        assert got.record["topic"] == "gateways/gw1/batches"
        assert {k: v for k, v in got.record.items() if k != "topic"} == {
            k: v for k, v in want.record.items() if k != "topic"}
    first, module, camera = landed[0].record, landed[3].record, landed[4].record
    assert (first["message_id"], first["device_id"], first["output"], first["priority"]) == ("gw1:101", "t1", "data", 5)
    assert (first["enqueued_ms"], first["sent_ms"], first["received_ms"]) == (at(0), SENT, RECEIVED)
    assert first["properties"] == {"firmware": "1.2", "unit": "C"} and first["content_type"] == "application/json"
    assert (module["module_id"], module["output"], module["ttl_s"]) == ("filter", "clean", 60)
    assert camera["payload"] is None and decode_payload(camera) == bytes(range(256))
    assert camera["content_type"] is None and camera["output"] is None and camera["ttl_s"] == 0


def test_redelivery_flag_and_priority_come_from_the_batch():
    items = [queued("t1", 1, 0, priority=10), queued("t2", 2, 0, priority=10)]
    landed = land_batch(batch_publish("gw1", items, sent_ms=SENT, received_ms=RECEIVED, redelivered=True))
    assert [(one.record["priority"], one.record["redelivered"]) for one in landed] == [(10, True), (10, True)]


def test_content_encoding_and_device_message_id_land_in_properties():
    """Both formats carry them (the one-message format since issue 24: the device's ``$.ce``, ``$.mid``
    and ``$.cid`` as user properties); they land under the device's own user property names."""
    item = queued("t1", 7, 0, properties=(("unit", "C"),), content_encoding="utf-8", device_message_id="dev-42")
    (landed,) = land_batch(batch_publish("gw1", [item], sent_ms=SENT, received_ms=RECEIVED))
    (one_message,) = one_message_records([item])
    assert landed.kind == EVENTS
    assert landed.record["properties"] == {"unit": "C", "content-encoding": "utf-8", "message-id": "dev-42"}
    assert one_message.record["properties"] == landed.record["properties"]
    differs = {k for k in LANDING_FIELDS if landed.record[k] != one_message.record[k]}
    assert differs == {"topic"}


def test_a_record_with_bad_json_alone_is_quarantined_as_its_one_message_publish_would_be():
    items = [queued("t1", 1, 0), queued("t2", 2, 0, payload=b'{"temperature": '), queued("t1", 3, 1)]
    landed = land_all(batch_publish("gw1", items, sent_ms=SENT, received_ms=RECEIVED))
    assert [one.kind for one in landed] == [EVENTS, QUARANTINE, EVENTS]
    bad = landed[1].record
    assert bad["reason"].startswith("payload is not valid JSON")
    assert (bad["message_id"], bad["gateway_id"], bad["device_id"]) == ("gw1:2", "gw1", "t2")
    assert bad["payload"] == '{"temperature": '  # raw, to replay
    (want,) = one_message_records(items[1:2])
    assert want.kind == QUARANTINE
    assert {k: v for k, v in bad.items() if k != "topic"} == {k: v for k, v in want.record.items() if k != "topic"}
    assert [one.record["message_id"] for one in landed if one.kind == EVENTS] == ["gw1:1", "gw1:3"]


def test_priority_out_of_range_quarantines_every_record_of_the_batch():
    items = [queued("t1", 1, 0), queued("t2", 2, 0)]
    landed = land_batch(batch_publish("gw1", items, sent_ms=SENT, received_ms=RECEIVED, priority=11))
    assert [(one.kind, one.record["reason"]) for one in landed] == [
        (QUARANTINE, "gw-priority out of range 0-10: 11")] * 2


def good_batch() -> bytes:
    return batch_publish("gw1", [queued("t1", 1, 0), queued("t2", 2, 0)], sent_ms=SENT, received_ms=RECEIVED).payload


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"temperature": 20}', "malformed batch: not a gateway batch (no 'GB' magic) at byte 0"),
        (b"GB\x02" + good_batch()[3:], "malformed batch: unsupported batch version 2 at byte 2"),
        (good_batch()[:-5], "malformed batch: record 1 payload of "),
        (good_batch() + b"\x00", "malformed batch: 1 bytes after the last record at byte "),
        (b"", "malformed batch: not a gateway batch (no 'GB' magic) at byte 0"),
    ],
)
def test_a_malformed_batch_is_one_quarantine_record_with_the_raw_payload(payload, reason):
    landed = land_all(Incoming("gateways/gw9/batches", payload, RECEIVED, redelivered=True))
    assert len(landed) == 1
    (record,) = [one.record for one in landed if one.kind == QUARANTINE]
    assert list(record) == list(LANDING_FIELDS)
    assert record["reason"].startswith(reason)
    assert (record["gateway_id"], record["message_id"], record["device_id"]) == ("gw9", None, None)
    assert (record["topic"], record["received_ms"], record["redelivered"]) == ("gateways/gw9/batches", RECEIVED, True)
    assert record["payload"] is None and base64.b64decode(record["payload_base64"]) == payload
    assert decode_payload(record) == payload  # replayable byte for byte


def test_a_batch_without_messages_is_quarantined():
    from appliance.forwarding.batch import encode_batch

    (landed,) = land_all(Incoming("gateways/gw1/batches", encode_batch("gw1", 5, SENT, []), RECEIVED))
    assert (landed.kind, landed.record["reason"], landed.record["gateway_id"]) == (
        QUARANTINE, "empty batch: no messages", "gw1")


def test_land_all_sends_only_the_batch_topic_to_the_batch_decoder():
    event = reading("gw1", "t1", 1, 0, 20.0, 21.0, True)
    assert land_all(event) == [land(event)]
    assert [one.kind for one in land_all(metrics("gw1", 0, {5: {"depth": 0}}))] == [METRICS]
    # A batch on a topic the batch filter does not match is not decoded: it fails as an event would.
    (stray,) = land_all(Incoming("gateways/gw1/batch", good_batch(), RECEIVED))
    assert stray.kind == QUARANTINE and stray.record["reason"].startswith("missing user properties")
    # A configured filter: the gateway id of a malformed batch comes from its first '+' level.
    (custom,) = land_all(Incoming("up/gw5/b/3", b"junk", RECEIVED), batch_filter="up/+/b/+")
    assert (custom.kind, custom.record["gateway_id"]) == (QUARANTINE, "gw5")
    assert custom.record["reason"].startswith("malformed batch")
