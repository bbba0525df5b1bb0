"""A device on the gateway's MQTT listener, for tests, the HIL rig's tests and benchmarks alike: a real
paho-mqtt client that publishes QoS 1 device-to-cloud messages and waits for each PUBACK (never a sleep)."""

from __future__ import annotations

import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from testing import paho_clients


class Device:
    """A device publishing QoS 1 over MQTT 5 (or 3.1.1); ``publish`` returns once the gateway's PUBACK is in."""

    def __init__(self, host: str, port: int, device_id: str, protocol: int = mqtt.MQTTv5) -> None:
        self.device_id = device_id
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=device_id, protocol=protocol)
        self.acks: dict[int, int] = {}
        self._cond = threading.Condition()
        self.client.on_publish = self._on_publish
        connected = threading.Event()
        self.client.on_connect = lambda *a: connected.set()
        self.client.connect(host, port)
        self.client.loop_start()
        if not connected.wait(10):
            self.close()
            raise TimeoutError("device did not connect")

    def _on_publish(self, client: mqtt.Client, userdata: object, mid: int, reason: object, properties: object) -> None:
        with self._cond:
            self.acks[mid] = getattr(reason, "value", 0)
            self._cond.notify_all()

    def publish(self, output: str, payload: bytes, props: dict[str, str] | None = None, content_type: str | None = None,
                wait: bool = True) -> int:
        properties = Properties(PacketTypes.PUBLISH)
        if props:
            properties.UserProperty = list(props.items())
        if content_type:
            properties.ContentType = content_type
        info = self.client.publish(f"devices/{self.device_id}/messages/events/{output}", payload, qos=1, properties=properties)
        if wait:
            return self.wait_ack(info.mid)
        return info.mid

    def publish_topic(self, topic: str, payload: bytes, props: list[tuple[str, str]] | None = None) -> int:
        """Publish on any topic (a hostile device's); the PUBACK reason code (always 0 over MQTT 3.1.1)."""
        properties = None
        if props and self.client.protocol == mqtt.MQTTv5:
            properties = Properties(PacketTypes.PUBLISH)
            properties.UserProperty = props
        return self.wait_ack(self.client.publish(topic, payload, qos=1, properties=properties).mid)

    def wait_ack(self, mid: int, timeout: float = 10.0) -> int:
        """The PUBACK reason code (0 = stored)."""
        with self._cond:
            if not self._cond.wait_for(lambda: mid in self.acks, timeout):
                raise TimeoutError(f"no PUBACK for {mid}")
            return self.acks[mid]

    def close(self) -> None:
        paho_clients.close(self.client)
