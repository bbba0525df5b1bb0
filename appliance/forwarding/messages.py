"""MQTT publishes from devices and modules as Edge Hub messages (see docs/message-format.md).

The topic says who sent the message and on which output; user properties are the application
properties; a few MQTT fields become system properties. Anything else under ``devices/#`` (for instance the
module-input topics the gateway itself publishes) is not telemetry and is left alone.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from appliance.forwarding.conditions import UNDEFINED, parse_json_body


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
        values = {
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
    """Map a local publish onto an Edge Hub message, or None when the topic is not telemetry."""
    parts = topic.split("/")
    if len(parts) < 4 or parts[0] != "devices" or not parts[1]:
        return None
    device = parts[1]
    if parts[2:4] == ["messages", "events"] and len(parts) in (4, 5):
        output = parts[4] if len(parts) == 5 and parts[4] else None
        source, module = "/messages/events", None
    elif len(parts) == 6 and parts[2] == "modules" and parts[4] == "outputs" and parts[3] and parts[5]:
        module, output = parts[3], parts[5]
        source = f"/messages/modules/{module}/outputs/{output}"
    else:
        return None
    app: list[tuple[str, str]] = []
    encoding = message_id = None
    for key, value in user_properties:
        if key == "content-encoding" and encoding is None:
            encoding = value
        elif key == "message-id" and message_id is None:
            message_id = value
        else:
            app.append((key, value))
    return Message(source, topic, payload, device, module, output, app, content_type, encoding, message_id)
