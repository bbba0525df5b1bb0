"""The cloud collector reads both upstream formats alike: a batch gives the messages its PUBLISHes would."""

from __future__ import annotations

import json

import pytest

from appliance.forwarding.batch import BatchFormatError, encode_batch
from appliance.forwarding.endpoints import identity_properties
from appliance.forwarding.messages import Message
from appliance.forwarding.queues import QueuedMessage
from hil_tests.harness import BATCH_TOPIC, CLOUD_TOPICS, GATEWAY_ID, upstream_messages

SENT_MS = 1_790_000_000_900


def reading(seq: int, device: str, output: str, priority: int, properties: list[tuple[str, str]]) -> QueuedMessage:
    payload = json.dumps({"seq": seq, "ts_ms": 1_790_000_000_000 + seq, "temp_c": 18.5}).encode()
    message = Message("/messages/events", f"devices/{device}/messages/events/{output}", payload, device, None, output,
                      properties, "application/json")
    return QueuedMessage(seq, "upstream", priority, 1_790_000_000_000 + 7 * seq, 120, 0, message)


ITEMS = [reading(41, "thermostat-00", "data", 1, []), reading(42, "thermostat-01", "data", 1, [("unit", "C")]),
         reading(45, "thermostat-00", "data", 1, [])]  # fmt: skip


def as_publishes(items: list[QueuedMessage]) -> list[tuple[str, bytes, dict[str, str]]]:
    """What the gateway sends for ``items`` in the one-message format (topic, payload, user properties)."""
    return [(f"gateways/{GATEWAY_ID}/devices/{item.message.device_id}/messages/events", item.message.payload,
             dict(identity_properties(item, GATEWAY_ID, SENT_MS))) for item in items]  # fmt: skip


def test_the_collector_subscribes_to_both_formats():
    assert f"gateways/{GATEWAY_ID}/batches" == BATCH_TOPIC
    assert BATCH_TOPIC in CLOUD_TOPICS


def test_a_batch_gives_the_messages_its_publishes_would():
    batched = upstream_messages(BATCH_TOPIC, encode_batch(GATEWAY_ID, 1, SENT_MS, ITEMS), {}, at=5.0)
    one_by_one = [seen for topic, payload, props in as_publishes(ITEMS) for seen in upstream_messages(topic, payload, props, 5.0)]
    assert batched == one_by_one
    assert [m.key for m in batched] == [f"{i.message.device_id}/data/{i.seq}@{1_790_000_000_000 + i.seq}" for i in ITEMS]
    assert [(m.priority, m.gw_message_id, m.gw_ms("gw-enqueued-ms")) for m in batched] == [
        (1, f"{GATEWAY_ID}:{i.seq}", i.enqueued_ms) for i in ITEMS
    ]


def test_publishes_without_the_gateways_identity_or_a_thermostat_payload_are_skipped():
    ((topic, payload, properties),) = as_publishes(ITEMS[:1])
    assert upstream_messages(topic, payload, {}, 1.0) == []
    assert upstream_messages(topic, b"not json", properties, 1.0) == []
    assert upstream_messages(f"gateways/{GATEWAY_ID}/metrics", b"{}", {}, 1.0) == []


def test_a_malformed_batch_raises():
    with pytest.raises(BatchFormatError):
        upstream_messages(BATCH_TOPIC, b"GB\x02", {}, 1.0)
