"""MQTT publishes from devices and modules as Edge Hub messages (see docs/message-format.md).

The topic says who sent the message and on which output, and may carry an IoT Hub property bag
(``appliance/forwarding/topics.py``); MQTT 5 user properties are application properties too; a few MQTT
fields become system properties. When the bag and the MQTT 5 fields name the same property
(case-insensitively, as routes look names up), the bag wins and the other is dropped: the topic is what
IoT Hub itself would route on, and one value per name keeps a route's answer from depending on which copy
a lookup meets first. Anything else under ``devices/#`` (for instance the module-input topics the gateway
itself publishes) is not telemetry and is left alone.

A property named ``gw-*`` (any case) is not the device's to set: the gateway stamps its own ``gw-*`` user
properties on every message it forwards (docs/message-format.md) and a device's copy, forwarded after them,
is the value the cloud ingest keeps - a forged ``gw-message-id`` deduplicates another message away, a
forged ``gw-device-id`` passes it off as another device's. Such properties are dropped at ingress; a module
that re-sends a message from its input (which carries the gateway's ``gw-*`` of the first hop) is
therefore not refused, and the next hop is stamped afresh.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from appliance.forwarding.conditions import UNDEFINED, parse_json_body
from appliance.forwarding.topics import parse_telemetry_topic
from appliance.forwarding.validity import check_publish_properties, check_topic_values

#: The prefix of the gateway's own user properties (``gw-message-id``, ...), never taken from a device.
GATEWAY_PREFIX = "gw-"


def _is_gateways(name: str) -> bool:
    return name.lower().startswith(GATEWAY_PREFIX)


@dataclass(slots=True)
class Message:
    """One message as routes see it and as the store keeps it."""

    source: str  # Edge Hub source path: /messages/events or /messages/modules/{m}/outputs/{o}
    topic: str
    payload: bytes
    device_id: str
    module_id: str | None = None
    output: str | None = None
    properties: list[tuple[str, str]] = field(default_factory=list)
    content_type: str | None = None
    content_encoding: str | None = None
    message_id: str | None = None
    system: dict[str, str] = field(default_factory=dict)  # other system properties (correlationId, to, ...)
    _json: Any = field(default=None, repr=False)
    _json_parsed: bool = field(default=False, repr=False)

    def app_property(self, name: str) -> Any:
        """Case-insensitive, as IoT Hub routing queries are; the first of repeated names wins."""
        lowered = name.lower()
        for key, value in self.properties:
            if key.lower() == lowered:
                return value
        return UNDEFINED

    def system_property(self, name: str) -> Any:
        value = self.system_properties().get(name.lower())
        return UNDEFINED if value is None else value

    def system_properties(self) -> dict[str, str]:
        values: dict[str, str | None] = {name.lower(): value for name, value in self.system.items()}
        values |= {
            "connectiondeviceid": self.device_id,
            "connectionmoduleid": self.module_id,
            "outputname": self.output,
            "contenttype": self.content_type,
            "contentencoding": self.content_encoding,
            "messageid": self.message_id,
        }
        return {k: v for k, v in values.items() if v is not None}

    def body_json(self) -> Any:
        if not self._json_parsed:
            encoding = (self.content_encoding or "utf-8").lower().replace("-", "")
            self._json = parse_json_body(self.payload, self.content_type) if encoding == "utf8" else UNDEFINED
            self._json_parsed = True
        return self._json


def message_from_publish(
    topic: str,
    payload: bytes,
    user_properties: list[tuple[str, str]],
    content_type: str | None,
) -> Message | None:
    """Map a local publish onto an Edge Hub message, or None when the topic is not telemetry.

    Raises ``InvalidMessage`` for telemetry that cannot be forwarded as it is (appliance/forwarding/validity.py):
    the device gets the reason code, and nothing is queued that would stop or stall its queue later."""
    parsed = parse_telemetry_topic(topic)
    if parsed is None:
        return None
    check_topic_values(parsed.device_id, parsed.module_id, parsed.output,
                       [*parsed.application, *parsed.system.items()])
    check_publish_properties(user_properties, content_type)
    system = dict(parsed.system)
    encoding = system.pop("contentEncoding", None)
    message_id = system.pop("messageId", None)
    content_type = system.pop("contentType", content_type)
    app = [(key, value) for key, value in parsed.application if not _is_gateways(key)]
    from_bag = {key.lower() for key, _ in parsed.application}
    for key, value in user_properties:
        if _is_gateways(key):
            continue
        if key == "content-encoding":
            encoding = encoding if encoding is not None else value
        elif key == "message-id":
            message_id = message_id if message_id is not None else value
        elif key.lower() not in from_bag:
            app.append((key, value))
    return Message(parsed.source, topic, payload, parsed.device_id, parsed.module_id, parsed.output, app, content_type,
                   encoding, message_id, system)
