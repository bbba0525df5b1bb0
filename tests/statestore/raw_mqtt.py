"""A bare paho-mqtt client for tests that must send what a well-behaved client never would.

Every event (message, PUBACK reason code, disconnect) is kept, so tests wait on events with a deadline
instead of sleeping.
"""

from __future__ import annotations

import queue
import uuid
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from testing.collector import Collector, Received

TIMEOUT = 5.0


class RawClient(Collector):
    """The suite's collector (`testing.collector`, which keeps the messages: `next_message`) with the PUBACK
    reason codes and disconnects in queues, and publishes that do not wait."""

    def __init__(
        self, host: str, port: int, protocol: int = mqtt.MQTTv5, client_id: str | None = None,
        username: str | None = None, password: str | None = None,
    ) -> None:
        self.client_id = client_id or f"raw-{uuid.uuid4().hex[:10]}"
        self.pubacks: queue.Queue[tuple[int, int]] = queue.Queue()  # (mid, reason code)
        self.disconnects: queue.Queue[int] = queue.Queue()
        super().__init__(host, port, protocol=protocol, client_id=self.client_id, name=self.client_id,
                         username=username, password=password, keepalive=30)
        self.mqtt = self.client
        self.mqtt.on_publish = lambda c, u, mid, rc, p: self.pubacks.put((mid, rc.value))
        self.mqtt.on_disconnect = self._on_disconnect

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any = None) -> None:
        self.disconnects.put(reason.value if hasattr(reason, "value") else int(reason))

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        user_properties: list[tuple[str, str]] | None = None,
    ) -> int:
        properties = None
        if self.mqtt.protocol == mqtt.MQTTv5:
            properties = Properties(PacketTypes.PUBLISH)
            if response_topic is not None:
                properties.ResponseTopic = response_topic
            if correlation_data is not None:
                properties.CorrelationData = correlation_data
            if user_properties:
                properties.UserProperty = user_properties
        return self.mqtt.publish(topic, payload, qos=qos, properties=properties).mid

    def next_message(self) -> Received:
        return self.next(TIMEOUT)
