"""Forwarding counters per endpoint and priority, and their two renderings: JSON for ``$SYS`` / the
cloud, Prometheus text for a scraper.

Counters live in memory and restart at zero with the process, as Prometheus counters may; depths and
oldest ages are read from the store when rendered, so they are right after a restart too. Beside the
queues: each pump's state (running, restarts, when its head last moved), the device messages refused at
ingress per reason (appliance/forwarding/validity.py) and the messages no route took (``unrouted``) -
what an operator needs to see that forwarding goes on, and why a device's messages do not arrive.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from appliance.asyncio_runtime import wall_clock
from appliance.forwarding.queues import QueueDepth, QueueKey
from appliance.prometheus import Family
from appliance.store_health import StoreHealth

COUNTERS = ("sent", "expired", "dropped", "retries", "dead_lettered")


@dataclass(slots=True)
class LinkStats:
    """One link's figures; ``connected`` remembers when it last changed (``changed_ms``, Unix ms by
    ``clock``), so "down for how long" can be told - by ``appliance doctor`` and by an alert."""

    bytes_sent: int = 0
    rate_bytes_per_s: float | None = None  # measured bottleneck
    rtt_s: float | None = None
    clock: Callable[[], float] = field(default=wall_clock, repr=False)
    changed_ms: int = -1  # set from ``clock`` at creation: a link starts down
    _connected: bool = False

    def __post_init__(self) -> None:
        if self.changed_ms < 0:
            self.changed_ms = int(self.clock() * 1000)

    @property
    def connected(self) -> bool:
        return self._connected

    @connected.setter
    def connected(self, up: bool) -> None:
        if up != self._connected:
            self._connected = up
            self.changed_ms = int(self.clock() * 1000)


@dataclass(slots=True)
class PumpState:
    running: bool = True
    restarts: int = 0
    head_moved_ms: int | None = None  # wall clock of the last checkpoint or dead letter; None: not since start


@dataclass(slots=True)
class ForwardingMetrics:
    counters: dict[str, Counter[QueueKey]] = field(default_factory=lambda: {name: Counter() for name in COUNTERS})
    links: dict[str, LinkStats] = field(default_factory=dict)
    #: Unix ms the counters started from (the process's start): what "never" means for a pump's head.
    started_ms: int = field(default_factory=lambda: int(wall_clock() * 1000))
    pumps: dict[str, PumpState] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)  # device messages refused at ingress, per reason
    unrouted: int = 0  # device messages no route took
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
        """``{endpoint: {priority: {depth, oldest_age_s, oldest_ttl_s, sent, expired, dropped, retries,
        dead_lettered}}}``; ``oldest_ttl_s`` is the TTL the oldest waiting message was stored with (0: none
        waiting)."""
        keys = set().union(*(set(c) for c in self.counters.values())) | {(d.endpoint, d.priority) for d in depths}
        by_key = {(d.endpoint, d.priority): d for d in depths}
        out: dict[str, dict[str, dict[str, float]]] = {}
        for endpoint, priority in sorted(keys):
            depth = by_key.get((endpoint, priority))
            row: dict[str, float] = {
                "depth": depth.depth if depth else 0,
                "oldest_age_s": round((now_ms - depth.oldest_enqueued_ms) / 1000, 3) if depth and depth.oldest_enqueued_ms else 0,
                "oldest_ttl_s": depth.oldest_ttl_s or 0 if depth else 0,
            }
            for name in COUNTERS:
                row[name] = self.counters[name][(endpoint, priority)]
            out.setdefault(endpoint, {})[str(priority)] = row
        return out

    def to_json(self, gateway_id: str, depths: list[QueueDepth], now_ms: int, store: StoreHealth | None = None) -> bytes:
        """The ``gateways/{id}/metrics`` document of docs/message-format.md, plus link figures and, given
        ``store``, whether ``forwarding.db`` commits."""
        links = {
            name: {"bytes_sent": s.bytes_sent, "rate_bytes_per_s": s.rate_bytes_per_s, "rtt_s": s.rtt_s,
                   "connected": s.connected, "since_ms": s.changed_ms}
            for name, s in self.links.items()
        }
        pumps = {name: {"running": p.running, "restarts": p.restarts, "head_moved_ms": p.head_moved_ms}
                 for name, p in sorted(self.pumps.items())}
        self.seq += 1
        document: dict[str, object] = {"gateway_id": gateway_id, "ts_ms": now_ms, "boot_id": self.boot_id,
                                       "seq": self.seq, "started_ms": self.started_ms,
                                       "endpoints": self.snapshot(depths, now_ms), "links": links, "pump": pumps,
                                       "refused": dict(sorted(self.refused.items())), "unrouted": self.unrouted}
        if store is not None:
            document["store"] = {"healthy": store.healthy, "disk_full": store.disk_full,
                                 "failed_commits": store.failed_commits}
        return json.dumps(document, separators=(",", ":")).encode()

    def families(self, depths: list[QueueDepth], now_ms: int) -> list[Family]:
        """The queues per endpoint and priority, and the links, for the gateway's Prometheus page. Every
        name carries its unit (``_seconds``, ``_bytes``, ``_messages``) or is a count of messages."""
        snapshot = self.snapshot(depths, now_ms)
        kinds: tuple[tuple[str, str, Literal["gauge", "counter"], str], ...] = (
            ("depth", "appliance_forwarding_queue_messages", "gauge", "messages waiting in the queue"),
            ("oldest_age_s", "appliance_forwarding_queue_oldest_age_seconds", "gauge",
             "age of the oldest waiting message (0: none waiting)"),
            ("oldest_ttl_s", "appliance_forwarding_queue_oldest_ttl_seconds", "gauge",
             "time-to-live the oldest waiting message was stored with (0: none waiting)"),
            ("sent", "appliance_forwarding_forwarded_total", "counter", "messages acknowledged by the endpoint"),
            ("expired", "appliance_forwarding_expired_total", "counter",
             "messages removed unsent because their TTL ran out"),
            ("dropped", "appliance_forwarding_dropped_total", "counter",
             "messages dropped to keep the store under its size limit"),
            ("retries", "appliance_forwarding_retries_total", "counter", "messages sent again after a failed batch"),
            ("dead_lettered", "appliance_forwarding_dead_lettered_total", "counter",
             "messages the endpoint kept refusing, moved to the dead letters"),
        )
        families = [
            Family(name, kind, help_text,
                   [({"endpoint": endpoint, "priority": priority}, row[key])
                    for endpoint, priorities in snapshot.items() for priority, row in priorities.items()])
            for key, name, kind, help_text in kinds
        ]
        links = self.links.items()
        return [
            *families,
            Family("appliance_link_sent_bytes_total", "counter", "payload bytes acknowledged by the endpoint",
                   [({"endpoint": n}, s.bytes_sent) for n, s in links]),
            Family("appliance_link_rate_bytes_per_second", "gauge",
                   "measured bottleneck rate of the link, in bytes (not bits) per second; 0 before a measurement",
                   [({"endpoint": n}, s.rate_bytes_per_s or 0) for n, s in links]),
            Family("appliance_link_rtt_seconds", "gauge", "measured round trip of the link; 0 before a measurement",
                   [({"endpoint": n}, s.rtt_s or 0) for n, s in links]),
            Family("appliance_link_connected", "gauge", "1 when the endpoint is connected",
                   [({"endpoint": n}, int(s.connected)) for n, s in links]),
            Family("appliance_link_last_change_timestamp_seconds", "gauge",
                   "Unix time the link last went up or down (its start, if it never changed)",
                   [({"endpoint": n}, s.changed_ms / 1000) for n, s in links]),
            Family("appliance_forwarding_pump_restarts_total", "counter",
                   "times the endpoint's pump failed and was started again",
                   [({"endpoint": n}, p.restarts) for n, p in sorted(self.pumps.items())]),
            Family("appliance_forwarding_pump_running", "gauge", "1 while the endpoint's pump runs",
                   [({"endpoint": n}, int(p.running)) for n, p in sorted(self.pumps.items())]),
            Family("appliance_forwarding_refused_total", "counter",
                   "device messages refused at ingress (reason code sent), per reason",
                   [({"reason": r}, n) for r, n in sorted(self.refused.items())]),
            Family("appliance_forwarding_unrouted_total", "counter", "device messages that matched no route",
                   [({}, self.unrouted)]),
        ]
