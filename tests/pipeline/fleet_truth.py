"""A fleet as an outside checker builds it, and the truth about it computed in plain Python.

Four gateways for three hours, every condition of issue 29 at once:

* ``gwA``: clock right, 1 s latency. ``a1`` reports all along (set point changes at 00:37:20 and
  01:42:20, seconds into a window); ``a2`` starts an over-the-air update at 01:10 and goes silent
  mid-update at 01:13 (one of its updater messages garbled, redelivered). Some readings are
  redelivered 40 s later by the other ingest writer (one across a latency window's boundary); a
  malformed reading is redelivered; an ingest reject is redelivered.
* ``gwB``: clock 7 minutes ahead, 2 s latency; ``b1``'s update to 0.2.0 is rolled back with a reason the
  thermostat repeats in its readings; a metrics document is redelivered 90 s later, in the next window.
* ``gwC``: clock 4 minutes behind, 3 s latency; ``c1``'s update to 0.2.0 is installed.
* ``gwD``: link down 00:50-01:50 (receive time), then its backlog drained oldest first, spread by the
  broker over three ingest writers; its clock steps back 10 minutes at 01:20 and forward 20 minutes at
  02:30 (the thermostat takes the gateway's time); the gateway restarts at 02:10 (a new boot, counters
  from zero).

Messages are landed by ``LandingWriter`` as the ingest does, each writer's files named with the
ingest's clock (``ingest_clock``); one writer can crash with its part of the drain in an open file.

The truth functions share no code with ``pipeline.jobs``: they read the generated messages (what the
gateways sent and when the cloud received them), not the landing files, and follow the rules of
docs/pipeline.md ("Outputs") written out here.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from pipeline.envelope import Incoming, land
from pipeline.landing import LandingWriter
from tests.pipeline.pipeline_data import T0

MINUTE = 60_000
WINDOW_MS = 5 * MINUTE
DRAIN_START = T0 + 110 * MINUTE  # gwD's link is back: its backlog comes in, oldest first
OUTAGE = (T0 + 50 * MINUTE, DRAIN_START)
END_MINUTE = 180
WRITERS = ("ingest-a", "ingest-b", "ingest-c")


@dataclass(frozen=True)
class Gateway:
    name: str
    latency_ms: int
    steps: tuple[tuple[int, int], ...]  # (from real ms, clock offset ms) in time order; before the first: 0

    def clock(self, real_ms: int) -> int:
        """The gateway's clock (and its thermostats', synced from it) at real time ``real_ms``."""
        offset = 0
        for start, value in self.steps:
            if real_ms >= start:
                offset = value
        return real_ms + offset


GW_A = Gateway("gwA", 1_000, ())
GW_B = Gateway("gwB", 2_000, ((T0 - MINUTE, 7 * MINUTE),))
GW_C = Gateway("gwC", 3_000, ((T0 - MINUTE, -4 * MINUTE),))
GW_D = Gateway("gwD", 100, ((T0 + 80 * MINUTE, -10 * MINUTE), (T0 + 150 * MINUTE, 10 * MINUTE)))
GATEWAYS = (GW_A, GW_B, GW_C, GW_D)


@dataclass
class Sent:
    """One PUBLISH as the cloud received it, and which ingest writer took it."""

    message: Incoming
    writer: str
    reading: dict | None = None  # the reading's fields when it is a valid reading (for the truth)
    metrics: dict | None = None  # the metrics document
    status: dict | None = None  # firmware status (update message or a reading's fw/update)
    meta: dict = field(default_factory=dict)  # gateway, device, priority, enqueued, sent, message id


def _props(gateway: str, device: str, message_id: str, priority: int, enqueued: int, sent: int, output: str):
    return [("gw-message-id", message_id), ("gw-gateway-id", gateway), ("gw-device-id", device),
            ("gw-priority", str(priority)), ("gw-enqueued-ms", str(enqueued)), ("gw-sent-ms", str(sent)),
            ("gw-ttl-s", "86400"), ("gw-output", output)]


class Fleet:
    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self._seq: dict[str, int] = defaultdict(int)
        self._writer_turn = 0

    def _writer(self) -> str:
        """The broker's shared subscription: writers a and b in turn (c only during the drain)."""
        self._writer_turn += 1
        return WRITERS[self._writer_turn % 2]

    def _send_time(self, gateway: Gateway, real_ms: int) -> int:
        """When the gateway sends a message made at ``real_ms`` (real time): at once, or in the drain."""
        if gateway is GW_D and OUTAGE[0] <= real_ms < OUTAGE[1]:
            queued = sum(1 for s in self.sent if s.meta.get("drained"))
            return DRAIN_START + queued * 200
        return real_ms

    def event(self, gateway: Gateway, device: str, real_ms: int, doc: dict, *, priority: int = 5,
              output: str = "data", content_type: str | None = "application/json", payload: bytes | None = None,
              **kinds) -> Sent:
        self._seq[gateway.name] += 1
        message_id = f"{gateway.name}:{self._seq[gateway.name]}"
        drained = gateway is GW_D and OUTAGE[0] <= real_ms < OUTAGE[1]
        send_real = self._send_time(gateway, real_ms)
        enqueued, sent_ms = gateway.clock(real_ms), gateway.clock(send_real)
        received = send_real + gateway.latency_ms
        body = payload if payload is not None else json.dumps(doc).encode()
        topic = f"gateways/{gateway.name}/devices/{device}/messages/events"
        message = Incoming(topic, body, received, _props(gateway.name, device, message_id, priority, enqueued, sent_ms,
                                                         output), content_type)
        writer = WRITERS[len([s for s in self.sent if s.meta.get("drained")]) % 3] if drained else self._writer()
        item = Sent(message, writer, meta={"gateway": gateway.name, "device": device, "priority": priority,
                                           "enqueued": enqueued, "sent": sent_ms, "message_id": message_id,
                                           "drained": drained, "received": received}, **kinds)
        self.sent.append(item)
        return item

    def reading(self, gateway: Gateway, device: str, real_ms: int, temperature: float, set_point: float, heater: bool,
                fw: str = "0.1.0", update: dict | None = None) -> Sent:
        ts = gateway.clock(real_ms)
        doc = {"device": device, "fw": fw, "registered": True, "temperature": temperature, "set_point": set_point,
               "heater": heater, "ts_ms": ts, "seq": self._seq[gateway.name] + 1, "update": update}
        return self.event(gateway, device, real_ms, doc,
                          reading={"ts": ts, "temperature": temperature, "set_point": set_point, "heater": heater},
                          status={"running": fw, "update": update})

    def update_status(self, gateway: Gateway, device: str, real_ms: int, fw: str, state: str, version: str,
                      reason: str | None = None) -> Sent:
        """What the updater publishes (output ``update``, no ``ts_ms``: its clock is not set)."""
        update = {"state": state, "version": version, "file": "app.mpy", "offset": 4096, "reason": reason}
        doc = {"device": device, "fw": fw, "registered": False, "temperature": None, "set_point": 21.0,
               "heater": False, "mem_free": 16000, "update": update}
        return self.event(gateway, device, real_ms, doc, priority=7, output="update",
                          status={"running": fw, "update": update})

    def redeliver(self, original: Sent, delay_ms: int, writer: str | None = None) -> Sent:
        """The same PUBLISH again (DUP set), ``delay_ms`` later, to the other writer unless told."""
        m = original.message
        copy = Incoming(m.topic, m.payload, m.received_ms + delay_ms, m.user_properties, m.content_type, True)
        other = writer or ("ingest-b" if original.writer == "ingest-a" else "ingest-a")
        item = Sent(copy, other, meta={**original.meta, "received": copy.received_ms, "copy": True})
        self.sent.append(item)
        return item

    def metrics(self, gateway: Gateway, real_ms: int, boot: str, seq: int, queues: dict[int, dict]) -> Sent:
        ts = gateway.clock(real_ms)
        doc = {"gateway_id": gateway.name, "ts_ms": ts, "boot_id": boot, "seq": seq,
               "endpoints": {"upstream": {str(p): q for p, q in queues.items()}}}
        message = Incoming(f"gateways/{gateway.name}/metrics", json.dumps(doc).encode(), real_ms + gateway.latency_ms,
                           [], "application/json")
        item = Sent(message, self._writer(), metrics=doc, meta={"gateway": gateway.name,
                                                                 "received": message.received_ms})
        self.sent.append(item)
        return item


def at(minute: float) -> int:
    return T0 + int(round(minute * MINUTE))


def build_fleet() -> Fleet:
    fleet = Fleet()
    a2_update = {70.5: "downloading", 71.5: "downloading", 72.5: "downloading"}
    for minute in range(END_MINUTE):
        real = at(minute + 20 / 60)  # 20 s into the minute
        # gwA/a1: set point 20 -> 22 at 00:37:20 -> 23 at 01:42:20
        set_point = 20.0 if minute < 37 else 22.0 if minute < 102 else 23.0
        a1 = fleet.reading(GW_A, "a1", real, 19.0 + (minute % 11) / 4, set_point, minute % 3 == 0)
        if minute in (4, 29, 64):
            fleet.redeliver(a1, 40_000)  # 4: 00:04:21 then 00:05:01, another latency window
        if minute < 73:  # a2 goes silent at 01:13, mid-update
            fleet.reading(GW_A, "a2", real + 5_000, 18.0 + (minute % 5) / 2, 19.5, minute % 2 == 0)
        # gwB/b1, clock +7 min: an update to 0.2.0 that is rolled back
        if minute in (45, 46):
            fleet.update_status(GW_B, "b1", at(minute), "0.1.0", "downloading", "0.2.0")
            fleet.update_status(GW_B, "b1", at(minute + 0.5), "0.1.0", "downloading", "0.2.0")
        elif minute == 47:
            fleet.update_status(GW_B, "b1", at(minute), "0.1.0", "rebooting", "0.2.0")
        else:
            rolled = {"state": "rolled_back", "version": "0.2.0", "reason": "no telemetry after its trial boot",
                      "file": None, "offset": None} if 48 <= minute < 60 else None
            fleet.reading(GW_B, "b1", real, 21.0 + (minute % 4) / 2, 21.0 if minute < 90 else 20.5, minute % 2 == 1,
                          update=rolled)
        # gwC/c1, clock -4 min: an update to 0.2.0, installed
        if minute == 60:
            fleet.update_status(GW_C, "c1", at(60), "0.1.0", "downloading", "0.2.0")
            fleet.update_status(GW_C, "c1", at(60.5), "0.1.0", "rebooting", "0.2.0")
        elif minute != 61:
            fleet.reading(GW_C, "c1", real, 17.5 + (minute % 6) / 3, 18.0, True, fw="0.1.0" if minute < 60 else "0.2.0")
        # gwD/d1: a backlog, clock steps of both signs
        fleet.reading(GW_D, "d1", real, 20.0 + (minute % 9) / 3, 20.0 if minute < 95 else 21.5, minute % 4 < 2)
        if minute + 0.5 in a2_update and minute < 73:
            fleet.update_status(GW_A, "a2", at(minute + 0.5), "0.1.0", a2_update[minute + 0.5], "0.3.0")
    # a malformed reading (no JSON object), redelivered; an ingest reject (no gw-* properties), redelivered
    bad = fleet.event(GW_A, "a1", at(30.5), {}, payload=b"[1, 2", content_type=None)
    fleet.redeliver(bad, 30_000)
    stray = Incoming("gateways/gwA/devices/a1/messages/events", b"{}", at(31), [("gw-gateway-id", "gwA")])
    fleet.sent.append(Sent(stray, "ingest-a", meta={"received": stray.received_ms, "stray": True}))
    fleet.sent.append(Sent(Incoming(stray.topic, stray.payload, at(31.2), stray.user_properties, None, True),
                           "ingest-b", meta={"received": at(31.2), "stray": True}))
    # an updater message cut to bytes that are no text (no content type: the ingest lands it), redelivered
    garbled = fleet.event(GW_A, "a2", at(71), {}, priority=7, output="update", content_type=None,
                          payload=b'\xff\xfe{"update": {"state"')
    fleet.redeliver(garbled, 20_000)
    _metrics(fleet)
    return fleet


def _metrics(fleet: Fleet) -> None:
    """Metrics every 2 minutes while the link is up: counters since the process started (``sent``: the
    gateway's messages sent so far in this boot), ``depth`` its queue."""
    for gateway in GATEWAYS:
        boot, seq, base_sent = f"{gateway.name}-boot1", 0, 0
        for minute in range(1, END_MINUTE, 2):
            real = at(minute)
            if gateway is GW_D and OUTAGE[0] <= real < OUTAGE[1]:
                continue  # metrics are not queued: lost with the link
            if gateway is GW_D and minute >= 130 and boot.endswith("1"):
                boot, seq = f"{gateway.name}-boot2", 0  # restarted: counters from zero
                base_sent = sum(1 for s in fleet.sent if s.meta.get("gateway") == gateway.name
                                and "message_id" in s.meta and not s.meta.get("copy") and s.meta["sent"] is not None
                                and _real_sent(gateway, s) < real - 60_000)
            seq += 1
            sent = sum(1 for s in fleet.sent if s.meta.get("gateway") == gateway.name and "message_id" in s.meta
                       and not s.meta.get("copy") and _real_sent(gateway, s) < real) - base_sent
            made = sum(1 for s in fleet.sent if s.meta.get("gateway") == gateway.name and "message_id" in s.meta
                       and not s.meta.get("copy") and s.meta["received"] - gateway.latency_ms < real + 1)
            queues = {5: {"depth": max(0, made - sent - base_sent) if gateway is GW_D else 0, "oldest_age_s": 0.5,
                          "sent": sent, "expired": minute // 40, "dropped": 0, "retries": seq // 7,
                          "dead_lettered": 0}}
            item = fleet.metrics(gateway, real, boot, seq, queues)
            if gateway is GW_B and minute == 13:
                fleet.redeliver(item, 90_000)  # 00:13:02 again at 00:14:32: the same window
            if gateway is GW_B and minute == 19:
                fleet.redeliver(item, 90_000)  # 00:19:02 again at 00:20:32: the next window


def _real_sent(gateway: Gateway, item: Sent) -> int:
    return item.meta["received"] - gateway.latency_ms


# -- landing ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def ingest_clock(ms: int):
    """The ingest's clock while it opens and seals files (the name of a file is its opening time)."""
    with mock.patch("pipeline.landing.time.time", return_value=ms / 1000):
        yield


def land_files(landing: Path, items: list[Sent], writer: str, *, crash: bool = False) -> None:
    """``items`` landed by one ingest writer, opened at the first one's receipt; ``crash``: the process dies
    after its last commit, its files left in progress (sealed by its next start)."""
    if not items:
        return
    items = sorted(items, key=lambda s: s.message.received_ms)
    with ingest_clock(items[0].message.received_ms):
        out = LandingWriter(landing, writer, roll_seconds=10**9)
        for item in items:
            landed = land(item.message)
            out.append(landed.kind, landed.record)
        out.commit()
        if not crash:
            out.close()


def land_range(landing: Path, fleet: Fleet, start_ms: int, end_ms: int, *, crash: str | None = None,
               only: str | None = None) -> None:
    """Every writer lands what it received in [start_ms, end_ms); ``crash``: that writer's files stay open."""
    for writer in WRITERS:
        if only is not None and writer != only:
            continue
        items = [s for s in fleet.sent if s.writer == writer and start_ms <= s.message.received_ms < end_ms]
        land_files(landing, items, writer, crash=writer == crash)


CORRUPT_LINE = '{"message_id":"gwA:cut","gateway_id":"gwA","received_ms":17672'


def land_corrupt_file(landing: Path) -> None:
    """A landing file whose last line was cut short (a disk that filled), as a foreign copy leaves it."""
    folder = landing / "events" / "date=2026-01-01" / "hour=00"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"part-copied-{T0 + 40 * MINUTE}-000001.jsonl").write_text(CORRUPT_LINE)


# -- the truth -----------------------------------------------------------------------------------------------

def _first_copies(fleet: Fleet) -> list[Sent]:
    """Events with a gateway envelope, the earliest received copy of each message id."""
    best: dict[str, Sent] = {}
    for item in fleet.sent:
        mid = item.meta.get("message_id")
        if mid is None:
            continue
        if mid not in best or item.message.received_ms < best[mid].message.received_ms:
            best[mid] = item
    return list(best.values())


def _window(ms: int) -> int:
    return ms - ms % WINDOW_MS


def rollups(fleet: Fleet) -> dict[tuple, dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for item in _first_copies(fleet):
        if item.reading is not None:
            r = item.reading
            groups[(item.meta["gateway"], item.meta["device"], _window(r["ts"]))].append(r)
    out = {}
    for key, rows in groups.items():
        rows.sort(key=lambda r: r["ts"])
        temps = [r["temperature"] for r in rows]
        out[key] = {"readings": len(rows), "temperature_min": min(temps), "temperature_avg": sum(temps) / len(temps),
                    "temperature_max": max(temps), "set_point_avg": sum(r["set_point"] for r in rows) / len(rows),
                    "set_point_last": rows[-1]["set_point"],
                    "heater_duty_cycle": sum(1 for r in rows if r["heater"]) / len(rows)}
    return out


def setpoint_changes(fleet: Fleet) -> dict[tuple, dict]:
    by_device: dict[tuple, list[tuple]] = defaultdict(list)
    for item in _first_copies(fleet):
        if item.reading is not None:
            by_device[(item.meta["gateway"], item.meta["device"])].append(
                (item.reading["ts"], item.meta["message_id"], item.reading))
    out = {}
    for (gateway, device), rows in by_device.items():
        previous = None
        for ts, mid, r in sorted(rows, key=lambda row: (row[0], row[1])):
            if previous is None or r["set_point"] != previous:
                out[(gateway, device, ts)] = {"previous_set_point": previous, "set_point": r["set_point"],
                                              "temperature": r["temperature"], "message_id": mid}
            previous = r["set_point"]
    return out


CLOCK_TOLERANCE_MS = 60_000


def delivery_latency(fleet: Fleet) -> dict[tuple, dict]:
    """Every message a gateway delivered (readings, rejects, update status messages), first copies."""
    groups: dict[tuple, list[Sent]] = defaultdict(list)
    for item in _first_copies(fleet):
        groups[(item.meta["gateway"], item.meta["priority"], _window(item.message.received_ms))].append(item)
    out = {}
    for key, items in groups.items():
        latencies = sorted(i.message.received_ms - i.meta["enqueued"] for i in items)
        offset = min(i.message.received_ms - i.meta["sent"] for i in items)
        n = len(latencies)
        out[key] = {"delivered": n, **{name: latencies[max(math.ceil(q * n), 1) - 1] for q, name in
                                       ((0.5, "latency_p50_ms"), (0.95, "latency_p95_ms"), (0.99, "latency_p99_ms"))},
                    "latency_max_ms": latencies[-1], "clock_offset_ms": offset,
                    "clock_suspect": offset < 0 or offset > CLOCK_TOLERANCE_MS}
    return out


COUNTERS = ("sent", "expired", "dropped", "retries", "dead_lettered")


def queue_counters(fleet: Fleet) -> dict[tuple, dict]:
    """In the gateway's order (boot, seq), a copy of a document counted once (its earliest receipt),
    windowed by receive time."""
    docs: dict[tuple, Sent] = {}
    for item in fleet.sent:
        if item.metrics is None and not (item.meta.get("copy") and item.message.topic.endswith("/metrics")):
            continue
        doc = json.loads(item.message.payload)
        key = (doc["gateway_id"], doc["boot_id"], doc["seq"])
        if key not in docs or item.message.received_ms < docs[key].message.received_ms:
            docs[key] = item
    out: dict[tuple, dict] = {}
    per_queue: dict[tuple, list] = defaultdict(list)
    for (gateway, boot, seq), item in docs.items():
        doc = json.loads(item.message.payload)
        for endpoint, queues in doc["endpoints"].items():
            for priority, q in queues.items():
                per_queue[(gateway, endpoint, int(priority))].append((boot, seq, item.message.received_ms, q))
    for key, samples in per_queue.items():
        boots_first = {}
        for boot, _, received, _ in samples:
            boots_first[boot] = min(received, boots_first.get(boot, received))
        samples.sort(key=lambda s: (boots_first[s[0]], s[0], s[1]))
        previous_boot, previous = None, {}
        for boot, _, received, q in samples:
            row = out.setdefault((*key, _window(received)), {"samples": 0, **dict.fromkeys(COUNTERS, 0),
                                                             "depth_max": None, "oldest_age_s_max": None})
            row["samples"] += 1
            for name in COUNTERS:
                before = previous.get(name, 0) if boot == previous_boot else 0
                value = q.get(name) or 0
                row[name] += value if value < before else value - before
            row["depth_max"] = q["depth"] if row["depth_max"] is None else max(row["depth_max"], q["depth"])
            row["oldest_age_s_max"] = q["oldest_age_s"] if row["oldest_age_s_max"] is None else max(
                row["oldest_age_s_max"], q["oldest_age_s"])
            previous_boot, previous = boot, {name: q.get(name) or 0 for name in COUNTERS}
    return out


def firmware_updates(fleet: Fleet) -> dict[tuple, dict]:
    """Per thermostat and target version (docs: ``firmware_updates``), in the gateway's clock."""
    statuses = []
    for item in _first_copies(fleet):
        if item.status is None:
            continue
        update = item.status["update"] or {}
        statuses.append((item.meta["gateway"], item.meta["device"], item.meta["enqueued"], item.status["running"],
                         update.get("state"), update.get("version"), update.get("reason")))
    out = {}
    for gateway, device, version in {(s[0], s[1], s[5]) for s in statuses if s[5] is not None}:
        own = sorted(s for s in statuses if s[:2] == (gateway, device))
        named = [s for s in own if s[5] == version]
        started = named[0][2]
        ran = [s[2] for s in own if s[3] == version and s[2] >= started]
        terminal = [s for s in named if s[4] in ("rolled_back", "refused", "waiting")]
        if ran:
            finished, outcome, reason = ran[0], "installed", None
        elif terminal:
            finished, outcome, reason = terminal[0][2], terminal[0][4], terminal[0][6]
        else:
            finished, outcome, reason = None, "in_progress", None
        out[(gateway, device, version)] = {
            "from_version": named[0][3], "started_ms": started, "finished_ms": finished,
            "duration_ms": None if finished is None else finished - started, "outcome": outcome, "reason": reason}
    return out


def quarantine(fleet: Fleet) -> dict[tuple, int]:
    """(stage, reason) -> rows: one per rejected message, however often it came; one per bad line."""
    return {("telemetry", "payload is not a JSON object"): 1,
            ("ingest", "missing user properties: gw-message-id, gw-device-id, gw-priority, gw-enqueued-ms, "
                       "gw-sent-ms, gw-ttl-s"): 1,
            ("landing", "landing line is not a JSON record (cut short?)"): 1,
            ("firmware", "update status is not UTF-8 text"): 1}
