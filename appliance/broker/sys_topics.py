"""``$SYS/broker/...`` statistics, named as mosquitto names them so existing dashboards keep working.

The counters are plain integers bumped on the hot path; ``snapshot`` turns them into (topic, payload)
pairs that the broker publishes as retained messages every ``interval`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.prometheus import Family, counter, gauge
from appliance.store_health import StoreHealth


@dataclass(slots=True)
class BrokerStats:
    started_at: float
    clients_connected: int = 0
    clients_total: int = 0
    messages_received: int = 0
    messages_sent: int = 0
    #: PUBLISH packets received, by their QoS (0, 1, 2).
    received_by_qos: list[int] = field(default_factory=lambda: [0, 0, 0])
    bytes_received: int = 0
    bytes_sent: int = 0
    publish_dropped: int = 0
    #: Deliveries dropped for sessions that have ended since (``lifecycle.end_session``): ``publish_dropped``
    #: is these plus what the live sessions dropped, so a counter never goes down when a session ends.
    dropped_by_ended_sessions: int = 0
    #: QoS 1/2 deliveries dropped at a full queue (``max_queued_bytes``, ``max_queued_messages``); also in
    #: ``publish_dropped``. Not in mosquitto, which counts them only there.
    queue_full: int = 0
    retained_count: int = 0
    #: ``broker.db`` commits (``store_health``): 1 while they succeed, 0 while they fail.
    store_healthy: int = 1
    store_failed_commits: int = 0
    store_refused: int = 0

    def store_health(self, health: StoreHealth) -> None:
        self.store_healthy = int(health.healthy)
        self.store_failed_commits = health.failed_commits
        self.store_refused = health.refused

    def snapshot(self, now: float) -> list[tuple[str, bytes]]:
        values = {
            "$SYS/broker/version": "appliance 0.1.0",
            "$SYS/broker/uptime": f"{int(now - self.started_at)} seconds",
            "$SYS/broker/clients/connected": self.clients_connected,
            "$SYS/broker/clients/total": self.clients_total,
            "$SYS/broker/messages/received": self.messages_received,
            "$SYS/broker/messages/sent": self.messages_sent,
            "$SYS/broker/bytes/received": self.bytes_received,
            "$SYS/broker/bytes/sent": self.bytes_sent,
            "$SYS/broker/publish/messages/dropped": self.publish_dropped,
            "$SYS/broker/publish/messages/queue-full": self.queue_full,
            "$SYS/broker/retained messages/count": self.retained_count,
            "$SYS/broker/store/healthy": self.store_healthy,
            "$SYS/broker/store/commits/failed": self.store_failed_commits,
            "$SYS/broker/store/refused": self.store_refused,
        }
        return [(topic, str(value).encode("ascii")) for topic, value in values.items()]

    def families(self, sent_by_qos: list[int]) -> list[Family]:
        """The broker's part of the gateway's Prometheus page (the store's health comes from
        ``StoreHealth.families``): clients, messages in and out per QoS (``sent_by_qos``: the router's
        deliveries by delivered QoS), bytes, retained messages and drops."""
        return [
            gauge("appliance_broker_clients_connected", "clients with an open MQTT connection", self.clients_connected),
            counter("appliance_broker_connections_total", "CONNECTs accepted", self.clients_total),
            Family("appliance_broker_messages_received_total", "counter", "PUBLISH packets received from clients, by QoS",
                   [({"qos": str(qos)}, n) for qos, n in enumerate(self.received_by_qos)]),
            Family("appliance_broker_messages_sent_total", "counter",
                   "messages delivered to subscribers, by the QoS they are delivered with",
                   [({"qos": str(qos)}, n) for qos, n in enumerate(sent_by_qos)]),
            counter("appliance_broker_received_bytes_total", "bytes read from client connections", self.bytes_received),
            counter("appliance_broker_sent_bytes_total", "bytes written to client connections", self.bytes_sent),
            gauge("appliance_broker_retained_messages", "retained messages held", self.retained_count),
            counter("appliance_broker_messages_dropped_total", "deliveries dropped (queue bounds, slow consumers)",
                    self.publish_dropped),
            counter("appliance_broker_messages_queue_full_total", "QoS 1/2 deliveries dropped at a full queue",
                    self.queue_full),
        ]
