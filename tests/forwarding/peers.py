"""Real MQTT peers for the forwarding tests: a paho subscriber that collects what arrives, and devices."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.forwarding.batch import BatchRecord, decode_batch, record_properties
from testing import paho_clients


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    user_properties: dict[str, str]
    at: float

    @property
    def n(self) -> int:
        return int(self.user_properties["n"])


class Collector:
    """Subscribes (MQTT 5, QoS 1) and keeps every message; ``wait_for`` blocks on a condition, not a sleep.
    Messages on a topic in ``aside`` (the gateway's own metrics document, published at start and on a timer
    whatever the devices do) are kept apart in ``set_aside``, so ``messages`` holds what the devices sent."""

    def __init__(self, host: str, port: int, topic: str, aside: frozenset[str] = frozenset()) -> None:
        self.messages: list[Received] = []
        self.set_aside: list[Received] = []
        self._aside = aside
        self._cond = threading.Condition()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"collector-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
        subscribed = threading.Event()
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: subscribed.set()
        self.client.on_connect = lambda c, *a: c.subscribe(topic, qos=1)
        self.client.connect(host, port)
        self.client.loop_start()
        if not subscribed.wait(10):
            self.close()
            raise TimeoutError("collector did not subscribe")

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        props = dict(getattr(message.properties, "UserProperty", []) or [])
        with self._cond:
            kept = self.set_aside if message.topic in self._aside else self.messages
            kept.append(Received(message.topic, message.payload, props, time.monotonic()))
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 15.0) -> list[Received]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.messages) >= count, timeout):
                raise TimeoutError(f"got {len(self.messages)} of {count} messages")
            return list(self.messages)

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
        """Until ``predicate()`` holds, re-checked on every arrival; ``what()`` describes a timeout."""
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise TimeoutError(what())

    def wait_for_topic(self, topic: str, timeout: float = 15.0) -> Received:
        kept = self.set_aside if topic in self._aside else self.messages
        with self._cond:
            if not self._cond.wait_for(lambda: any(m.topic == topic for m in kept), timeout):
                raise TimeoutError(f"nothing on {topic} among {len(kept)} messages")
            return next(m for m in kept if m.topic == topic)

    def close(self) -> None:
        paho_clients.close(self.client)


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
