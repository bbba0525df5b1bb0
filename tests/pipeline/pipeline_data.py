"""Small real data for the pipeline tests: messages as the gateway sends them, landed the way ingest does.

Messages go through ``pipeline.envelope.land`` and ``pipeline.landing.LandingWriter``, so the jobs read
files exactly like the ones in production. Each ``write_batch`` call seals its own files and stamps them
with increasing modification times, which is the order the streaming file source takes them in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.envelope import Incoming, land
from pipeline.landing import LandingWriter

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE = 60_000


def at(minutes: float) -> int:
    return T0 + int(minutes * MINUTE)


def gateway_properties(gateway: str, device: str, seq: int, *, priority: int = 5, enqueued_ms: int,
                       output: str | None = "data", sent_ms: int | None = None) -> list[tuple[str, str]]:
    props = [
        ("gw-message-id", f"{gateway}:{seq}"),
        ("gw-gateway-id", gateway),
        ("gw-device-id", device),
        ("gw-priority", str(priority)),
        ("gw-enqueued-ms", str(enqueued_ms)),
        ("gw-sent-ms", str(sent_ms if sent_ms is not None else enqueued_ms)),
        ("gw-ttl-s", "3600"),
    ]
    if output is not None:
        props.append(("gw-output", output))
    return props


def reading(gateway: str, device: str, seq: int, minute: float, temperature: float, set_point: float,
            heater: bool, *, latency_ms: int = 1_000, priority: int = 5, received_ms: int | None = None,
            payload: bytes | None = None, content_type: str | None = "application/json",
            redelivered: bool = False) -> Incoming:
    """A thermostat reading taken at ``minute``, enqueued at once and received ``latency_ms`` later."""
    ts = at(minute)
    body = payload if payload is not None else json.dumps(
        {"temperature": temperature, "set_point": set_point, "heater": heater, "device": device, "ts_ms": ts}
    ).encode()
    return Incoming(
        topic=f"gateways/{gateway}/devices/{device}/messages/events",
        payload=body,
        received_ms=received_ms if received_ms is not None else ts + latency_ms,
        user_properties=gateway_properties(gateway, device, seq, priority=priority, enqueued_ms=ts),
        content_type=content_type,
        redelivered=redelivered,
    )


def queued(device: str, seq: int, minute: float, *, payload: bytes | None = None, output: str | None = "data",
           module: str | None = None, properties: tuple[tuple[str, str], ...] = (),
           content_type: str | None = "application/json", content_encoding: str | None = None,
           device_message_id: str | None = None, priority: int = 5, ttl_s: int = 3600):
    """A thermostat reading taken at ``minute`` as the gateway's store holds it (for upstream batches)."""
    from appliance.forwarding.messages import Message
    from appliance.forwarding.queues import QueuedMessage

    ts = at(minute)
    body = payload if payload is not None else json.dumps(
        {"temperature": 20.0 + seq / 10, "set_point": 21.0, "heater": seq % 2 == 0, "device": device, "ts_ms": ts}
    ).encode()
    source = f"/messages/modules/{module}/outputs/{output}" if module else "/messages/events"
    message = Message(source, f"devices/{device}/messages/events/{output}", body, device, module, output,
                      list(properties), content_type, content_encoding, device_message_id)
    return QueuedMessage(seq, "upstream", priority, ts, ttl_s, ts + ttl_s * 1000, message)


def batch_publish(gateway: str, items: list, *, sent_ms: int, received_ms: int, priority: int | None = None,
                  redelivered: bool = False) -> Incoming:
    """``items`` (QueuedMessages of one priority) as the gateway sends them with ``format = "batch"``."""
    from appliance.forwarding.batch import encode_batch

    priority = items[0].priority if priority is None else priority
    return Incoming(f"gateways/{gateway}/batches", encode_batch(gateway, priority, sent_ms, items), received_ms,
                    redelivered=redelivered)


def single_publish(gateway: str, item, *, sent_ms: int, received_ms: int, redelivered: bool = False) -> Incoming:
    """``item`` as the gateway sends it with ``format = "message"`` (its own identity_properties)."""
    from appliance.forwarding.endpoints import identity_properties

    return Incoming(f"gateways/{gateway}/devices/{item.message.device_id}/messages/events", item.message.payload,
                    received_ms, identity_properties(item, gateway, sent_ms), item.message.content_type, redelivered)


def metrics(gateway: str, minute: float, queues: dict[int, dict], endpoint: str = "upstream",
            received_delay_ms: int = 500) -> Incoming:
    ts = at(minute)
    doc = {"gateway_id": gateway, "ts_ms": ts, "endpoints": {endpoint: {str(p): q for p, q in queues.items()}}}
    return Incoming(topic=f"gateways/{gateway}/metrics", payload=json.dumps(doc).encode(),
                    received_ms=ts + received_delay_ms, content_type="application/json")


def write_batch(landing: Path, messages: list[Incoming], index: int) -> None:
    """Land ``messages`` as batch number ``index`` (sealed files, mtime ordered by index)."""
    writer = LandingWriter(landing, f"test-{index:03d}")
    for message in messages:
        landed = land(message)
        writer.append(landed.kind, landed.record)
    writer.close()
    for path in landing.glob(f"*/date=*/hour=*/part-test-{index:03d}-*.jsonl"):
        stamp = 1_700_000_000 + index
        os.utime(path, (stamp, stamp))


# -- the sample: one gateway, two thermostats, 18 minutes, in four landing batches ------------------------
# t1: priority 5, 1 s latency, set point 20 -> 21 at minute 3 -> 22 at minute 14, heater on at even minutes.
# t2: priority 2, 5 s latency, set point 19, heater always on. Readings every minute (t2 at :30).
# Batch 1 also has a redelivered duplicate, three telemetry rejects and one ingest reject; batch 2 an
# out-of-order reading (within a 2-minute lateness), a gateway restart (counters reset) and a repeated
# metrics message. The last batch is a "flush": one reading and one metrics message a day later, from
# another gateway, that move every watermark past the sample (compare everything but gateway "gwf").
SAMPLE_LATENESS = "2 minutes"
FLUSH_GATEWAY = "gwf"


def _t1_set_point(minute: float) -> float:
    return 20.0 if minute < 3 else 21.0 if minute < 14 else 22.0


def _minutes(first: int, last: int) -> list[Incoming]:
    out = []
    for minute in range(first, last + 1):
        out.append(reading("gw1", "t1", 2 * minute + 1, minute, 19.0 + minute / 10, _t1_set_point(minute),
                           minute % 2 == 0))
        out.append(reading("gw1", "t2", 2 * minute + 2, minute + 0.5, 18.0, 19.0, True, priority=2, latency_ms=5_000))
    return out


def _queue(sent: int, expired: int = 0, dropped: int = 0, retries: int = 0, depth: int = 0, age: float = 0.0):
    return {"depth": depth, "oldest_age_s": age, "sent": sent, "expired": expired, "dropped": dropped,
            "retries": retries}


def sample_batches() -> list[list[Incoming]]:
    batch0 = _minutes(0, 5) + [metrics("gw1", 1, {5: _queue(10, depth=3, age=1.5), 2: _queue(4)})]
    metrics6 = metrics("gw1", 6, {5: _queue(25, expired=2, dropped=1, retries=3, depth=1, age=0.5), 2: _queue(9)})
    batch1 = _minutes(6, 11) + [
        reading("gw1", "t1", 11, 5, 19.5, 21.0, False, received_ms=at(6.2), redelivered=True),  # copy of gw1:11
        reading("gw1", "t1", 901, 7, 0, 0, False, payload=b"{not json", content_type=None),
        reading("gw1", "t1", 902, 7, 0, 0, False,
                payload=b'{"temperature": "hot", "set_point": 20, "heater": true, "device": "t1", "ts_ms": 1}'),
        reading("gw1", "t1", 903, 7, 20.0, 20.0, False,
                payload=json.dumps({"temperature": 20.0, "set_point": 20.0, "heater": False, "device": "t2",
                                    "ts_ms": at(7)}).encode()),
        Incoming(topic="gateways/gw1/devices/t1/messages/events", payload=b"{}", received_ms=at(7),
                 user_properties=[("gw-gateway-id", "gw1")]),
        metrics6,
    ]
    batch2 = _minutes(12, 17) + [
        reading("gw1", "t1", 904, 10.5, 20.0, 21.0, True),  # out of order, within the lateness
        metrics("gw1", 11, {5: _queue(5), 2: _queue(1)}),  # the gateway restarted: counters from zero
        Incoming(metrics6.topic, metrics6.payload, metrics6.received_ms + 60_000, [], metrics6.content_type, True),
    ]
    flush = [
        reading(FLUSH_GATEWAY, "tf", 1, 24 * 60, 20.0, 20.0, False),
        metrics(FLUSH_GATEWAY, 24 * 60, {0: _queue(0)}),
    ]
    return [batch0, batch1, batch2, flush]


def write_sample(landing: Path, batches: range | None = None) -> None:
    all_batches = sample_batches()
    for index in batches if batches is not None else range(len(all_batches)):
        write_batch(landing, all_batches[index], index)


# -- a HIL timeline: run r1, scenario "outage", as hil_tests/timeline.py writes it ---------------------------
# t_ms counts from the scenario's start. m1 (priority 0) delivered after 200 ms; m2 (priority 0) delivered
# twice, first after 2.5 s; m3 (priority 5) expired on the gateway; m4 (priority 5) sent and never seen
# again (lost); m5 (priority 5) delivered after 4 s. The rig: reset, 64 kbit/s and 50 ms at 0 s; down at
# 1 s (and a refused LOSS 100); up at 3 s with 32 kbit/s and 1% loss; a STATUS at 5 s reports 16 kbit/s and
# 300 ms (set by hand, say).
def hil_timeline() -> list[dict]:
    def event(message_id, priority, event, t, detail=None):
        return {"run_id": "r1", "scenario": "outage", "message_id": message_id, "priority": priority,
                "device": "t1" if message_id else None, "event": event, "t_ms": t, "detail": detail or {}}

    def rig(t, command, reply=None):
        return event(None, None, "rig", t, {"command": command, "reply": reply or f"OK {command}"})

    return [
        rig(0, "RESET"), rig(0, "RATE 64000"), rig(0, "DELAY 50"),
        event("m1", 0, "sent", 100), event("m1", 0, "received", 300),
        event("m2", 0, "sent", 500), event("m2", 0, "received", 3000), event("m2", 0, "received", 3100),
        rig(1000, "DOWN"), rig(1100, "LOSS 100", "ERR use DOWN"),
        event("m3", 5, "sent", 1200), event("m3", 5, "expired", 2600),
        event("m4", 5, "sent", 1500),
        event("m5", 5, "sent", 1800), event("m5", 5, "received", 5800),
        rig(3000, "UP"), rig(3000, "RATE 32000"), rig(3001, "LOSS 1"),
        rig(5000, "STATUS", "OK backend=userspace up=1 rate=16000 burst=1600 delay=300 jitter=0 loss=1 "
                            "features=rate,delay,jitter,loss,down bytes_up=123"),
    ]


def write_hil(folder: Path) -> Path:
    path = folder / "r1" / "outage.jsonl"  # <artifacts>/<run id>/<scenario>.jsonl
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in hil_timeline()))
    return path
