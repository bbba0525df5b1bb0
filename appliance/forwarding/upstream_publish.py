"""What the upstream bridge puts on the wire for a batch of queued messages: topics, payloads, properties.

Rules
-----
* ``message`` format: one PUBLISH per message, its topic from ``topic_template``, its identity in ``gw-*``
  user properties over MQTT 5 (MQTT 3.1.1 has none: the template carries ``{message_id}`` and
  ``{priority}``). ``batch`` format: consecutive runs of at most ``chunk_bytes`` payload packed into one
  PUBLISH each (``batch.py``, docs/message-format.md).
* Every PUBLISH is stamped with the moment it is handed to the link (``sent_ms``): a retry is a new attempt.
* A PUBLISH a conforming MQTT 5 server must refuse (control characters in its topic or properties, more
  bytes than the server's Maximum Packet Size) is never sent: ``check`` raises ``Unsendable`` with the
  reason. Topic aliases are never used, so the server's Topic Alias Maximum cannot be exceeded.

No I/O and no clock: the bridge (``upstream.py``) decides when, this module only what.
"""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.forwarding.batch import encode_batch
from appliance.forwarding.config import UpstreamConfig
from appliance.forwarding.endpoints import Unsendable, identity_properties, message_id
from appliance.forwarding.queues import QueuedMessage
from appliance.forwarding.validity import publish_size, upstream_problem


def wire_size(topic: str, payload: bytes, properties: Properties | None) -> int:
    """Roughly the PUBLISH packet's size: what the link actually carries for it."""
    size = 2 + 2 + 2 + len(topic) + 8 + len(payload)
    for key, value in getattr(properties, "UserProperty", None) or ():
        size += 5 + len(key) + len(value)
    return size


def pack(batch: list[QueuedMessage], chunk_bytes: int) -> list[list[QueuedMessage]]:
    """Consecutive runs of ``batch`` of at most ``chunk_bytes`` payload each (at least one message)."""
    chunks: list[list[QueuedMessage]] = []
    size = 0
    for item in batch:
        if not chunks or size + item.size > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += item.size
    return chunks


class PublishFormat:
    """The upstream's message format for one gateway (``settings.format``, ``settings.protocol``)."""

    def __init__(self, settings: UpstreamConfig, gateway_id: str) -> None:
        self.settings = settings
        self.gateway_id = gateway_id

    def topic_for(self, item: QueuedMessage) -> str:
        m = item.message
        return self.settings.topic_template.format(
            gateway_id=self.gateway_id, device_id=m.device_id, module_id=m.module_id or "", output=m.output or "",
            message_id=message_id(item, self.gateway_id), priority=item.priority,
        )

    def groups(self, batch: list[QueuedMessage], chunk_bytes: int | None) -> list[list[QueuedMessage]]:
        """The messages of each PUBLISH that ``batch`` goes out as (``chunk_bytes``: the packed window's)."""
        if self.settings.format == "batch":
            assert chunk_bytes is not None
            return pack(batch, chunk_bytes)
        return [[item] for item in batch]

    def unit(self, items: list[QueuedMessage], sent_ms: int) -> tuple[str, bytes, Properties | None]:
        """(topic, payload, properties) of the PUBLISH of ``items``, stamped ``sent_ms`` (this attempt)."""
        if self.settings.format == "batch":
            priority = items[0].priority
            return (self.settings.batch_topic.format(gateway_id=self.gateway_id, priority=priority),
                    encode_batch(self.gateway_id, priority, sent_ms, items), None)
        item = items[0]
        properties = None
        if self.settings.protocol == "5":
            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            properties.UserProperty = identity_properties(item, self.gateway_id, sent_ms)
            if item.message.content_type:
                properties.ContentType = item.message.content_type
        return self.topic_for(item), item.message.payload, properties

    def check(self, topic: str, payload: bytes, properties: Properties | None, max_packet: int | None) -> None:
        """Raise ``Unsendable`` for a PUBLISH that a conforming MQTT 5 server must refuse (``max_packet``:
        the server's Maximum Packet Size from its CONNACK, None if it announced none)."""
        user_properties = list(getattr(properties, "UserProperty", None) or ())
        content_type = getattr(properties, "ContentType", None)
        packed = properties.pack() if properties is not None else None  # type: ignore[no-untyped-call]
        if packed is None and self.settings.protocol == "5":
            packed = b"\0"  # paho sends an empty property block
        size = publish_size(topic, len(payload), packed)
        problem = upstream_problem(topic, user_properties, content_type, size, max_packet)
        if problem is not None:
            raise Unsendable(problem.detail, [])
