"""Readers of what the gateway sent upstream, for the forwarding tests: over the suite's collector
(`testing.collector`), whichever upstream format the gateway used."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.forwarding.batch import BatchRecord, decode_batch, record_properties
from testing.collector import Collector


@dataclass(frozen=True)
class Delivered:
    """One message as the cloud got it, from either upstream format."""

    n: int  # the test's "n" application property
    message_id: str
    priority: int


def delivered(collector: Collector, count: int, timeout: float = 15.0) -> list[Delivered]:
    """Every message on ``gateways/...`` (batches unpacked), in arrival order, once ``count`` distinct ids are in."""

    def unpack() -> list[Delivered]:
        properties = []
        for m in collector.messages:
            if m.topic.endswith("/batches"):
                batch = decode_batch(m.payload)
                properties += [dict(record_properties(batch, record)) for record in batch.records]
            elif not m.topic.endswith("/metrics"):
                properties.append(m.user_properties)
        return [Delivered(int(p["n"]), p["gw-message-id"], int(p["gw-priority"])) for p in properties]

    collector.wait_until(lambda: len({d.message_id for d in unpack()}) >= count, timeout,
                         lambda: f"got {len(unpack())} of {count} messages")
    return unpack()


def batch_records(collector: Collector, count: int, timeout: float = 15.0) -> list[BatchRecord]:
    """The messages of the batches on ``gateways/+/batches``, in arrival order, once ``count`` distinct ids are in."""

    def records() -> list[BatchRecord]:
        return [r for m in collector.messages if m.topic.endswith("/batches") for r in decode_batch(m.payload).records]

    collector.wait_until(lambda: len({r.message_id for r in records()}) >= count, timeout,
                         lambda: f"got {len(records())} of {count} batched messages")
    return records()
