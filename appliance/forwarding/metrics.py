"""Forwarding counters per endpoint and priority, and their two renderings: JSON for ``$SYS`` / the
cloud, Prometheus text for a scraper.

Counters live in memory and restart at zero with the process, as Prometheus counters may; depths and
oldest ages are read from the store when rendered, so they are right after a restart too.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field

from appliance.forwarding.queues import QueueDepth, QueueKey
from appliance.prometheus import Family

COUNTERS = ("sent", "expired", "dropped", "retries", "dead_lettered")


@dataclass(slots=True)
class LinkStats:
    bytes_sent: int = 0
    rate_bps: float | None = None  # measured bottleneck, bytes per second
    rtt_s: float | None = None
    connected: bool = False


@dataclass(slots=True)
class ForwardingMetrics:
    counters: dict[str, Counter[QueueKey]] = field(default_factory=lambda: {name: Counter() for name in COUNTERS})
    links: dict[str, LinkStats] = field(default_factory=dict)
    # The order of the documents whatever the gateway's clock does (a step back made every counter drop
    # read as a restart): one boot id per process, a sequence number per document within it.
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    seq: int = 0

    def add(self, name: str, counts: Counter[QueueKey] | dict[QueueKey, int]) -> None:
        self.counters[name].update(counts)

    def count(self, name: str, endpoint: str, priority: int, n: int = 1) -> None:
        if n:
            self.counters[name][(endpoint, priority)] += n

    def snapshot(self, depths: list[QueueDepth], now_ms: int) -> dict[str, dict[str, dict[str, float]]]:
        """``{endpoint: {priority: {depth, oldest_age_s, sent, expired, dropped, retries, dead_lettered}}}``."""
        keys = set().union(*(set(c) for c in self.counters.values())) | {(d.endpoint, d.priority) for d in depths}
        by_key = {(d.endpoint, d.priority): d for d in depths}
        out: dict[str, dict[str, dict[str, float]]] = {}
        for endpoint, priority in sorted(keys):
            depth = by_key.get((endpoint, priority))
            row: dict[str, float] = {
                "depth": depth.depth if depth else 0,
                "oldest_age_s": round((now_ms - depth.oldest_enqueued_ms) / 1000, 3) if depth and depth.oldest_enqueued_ms else 0,
            }
            for name in COUNTERS:
                row[name] = self.counters[name][(endpoint, priority)]
            out.setdefault(endpoint, {})[str(priority)] = row
        return out

    def to_json(self, gateway_id: str, depths: list[QueueDepth], now_ms: int) -> bytes:
        """The ``gateways/{id}/metrics`` document of docs/message-format.md, plus link figures."""
        links = {
            name: {"bytes_sent": s.bytes_sent, "rate_bps": s.rate_bps, "rtt_s": s.rtt_s, "connected": s.connected}
            for name, s in self.links.items()
        }
        self.seq += 1
        document = {"gateway_id": gateway_id, "ts_ms": now_ms, "boot_id": self.boot_id, "seq": self.seq,
                    "endpoints": self.snapshot(depths, now_ms), "links": links}
        return json.dumps(document, separators=(",", ":")).encode()

    def families(self, depths: list[QueueDepth], now_ms: int) -> list[Family]:
        """The queues per endpoint and priority, and the links, for the gateway's Prometheus page."""
        snapshot = self.snapshot(depths, now_ms)
        kinds = (
            ("depth", "gauge", "messages waiting in the queue"),
            ("oldest_age_s", "gauge", "age of the oldest waiting message in seconds"),
            ("sent", "counter", "messages acknowledged by the endpoint"),
            ("expired", "counter", "messages removed unsent because their TTL ran out"),
            ("dropped", "counter", "messages dropped to keep the store under its size limit"),
            ("retries", "counter", "messages sent again after a failed batch"),
            ("dead_lettered", "counter", "messages the endpoint kept refusing, moved to the dead letters"),
        )
        families = [
            Family(f"gateway_forwarding_{name}" + ("_total" if kind == "counter" else ""), kind, help_text,
                   [({"endpoint": endpoint, "priority": priority}, row[name])
                    for endpoint, priorities in snapshot.items() for priority, row in priorities.items()])
            for name, kind, help_text in kinds
        ]
        links = self.links.items()
        return [
            *families,
            Family("gateway_link_bytes_sent_total", "counter", "payload bytes acknowledged upstream",
                   [({"endpoint": n}, s.bytes_sent) for n, s in links]),
            Family("gateway_link_rate_bytes", "gauge", "measured bottleneck rate in bytes per second",
                   [({"endpoint": n}, s.rate_bps or 0) for n, s in links]),
            Family("gateway_link_connected", "gauge", "1 when the endpoint is connected",
                   [({"endpoint": n}, int(s.connected)) for n, s in links]),
        ]
