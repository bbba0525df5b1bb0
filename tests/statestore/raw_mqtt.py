"""A bare paho-mqtt client for tests that must send what a well-behaved client never would.

Every event (message, PUBACK reason code, disconnect) lands in a queue, so tests wait on events with a
deadline instead of sleeping.
"""

from __future__ import annotations

import queue
import threading
import uuid
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

TIMEOUT = 5.0


class RawClient:
    def __init__(
        self, host: str, port: int, protocol: int = mqtt.MQTTv5, client_id: str | None = None,
        username: str | None = None, password: str | None = None,
    ) -> None:
        self.client_id = client_id or f"raw-{uuid.uuid4().hex[:10]}"
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.pubacks: queue.Queue[tuple[int, int]] = queue.Queue()  # (mid, reason code)
        self.disconnects: queue.Queue[int] = queue.Queue()
        self._connected = threading.Event()
        self._subscribed = threading.Event()
        self.mqtt = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=protocol)
        self.mqtt.on_connect = lambda *a: self._connected.set()
        self.mqtt.on_message = lambda c, u, m: self.messages.put(m)
        self.mqtt.on_publish = lambda c, u, mid, rc, p: self.pubacks.put((mid, rc.value))
        self.mqtt.on_subscribe = lambda *a: self._subscribed.set()
        self.mqtt.on_disconnect = self._on_disconnect
        if username is not None:
            self.mqtt.username_pw_set(username, password)
        self.mqtt.connect(host, port, keepalive=30)
        self.mqtt.loop_start()
        if not self._connected.wait(TIMEOUT):
            raise TimeoutError("no CONNACK")

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any = None) -> None:
        self.disconnects.put(reason.value if hasattr(reason, "value") else int(reason))

    def subscribe(self, topic: str) -> None:
        self._subscribed.clear()
        self.mqtt.subscribe(topic, qos=1)
        if not self._subscribed.wait(TIMEOUT):
            raise TimeoutError("no SUBACK")

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

    def next_message(self) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=TIMEOUT)

    def close(self) -> None:
        self.mqtt.disconnect()
        self.mqtt.loop_stop()
