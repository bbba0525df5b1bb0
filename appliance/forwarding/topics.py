"""Device telemetry topics, as IoT Hub and Edge Hub's MQTT head read them, plus this gateway's own forms.

Azure IoT device SDKs - and any MQTT 3.1.1 device, which has no user properties - put a message's
properties in the topic: ``devices/{deviceId}/messages/events/{property_bag}``, the bag URL-encoded
``key=value&key2=value2``. Edge Hub's MQTT head accepts the same for modules,
``devices/{deviceId}/modules/{moduleId}/messages/events/{property_bag}``, with the output name in the bag
(``$.on``), and tolerates a trailing ``/``. Keys of the form ``$.xx`` (and ``ack``, ``iothub-operation``)
are system properties, mapped to their names as Edge Hub's ``SystemProperties.IncomingSystemPropertiesMap``
does; every other key is an application property.

This gateway's own forms stay: ``devices/{d}/messages/events/{output}`` (a last segment without ``=`` is
an output name, as the thermostat firmware publishes ``.../events/alerts``), optionally followed by a
bag (``.../events/alerts/alert=true``), and ``devices/{d}/modules/{m}/outputs/{o}``.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote

from appliance.broker.api import TOPIC_NAME_INVALID
from appliance.forwarding.validity import InvalidMessage

#: On-the-wire bag key -> system property name (Edge Hub's ``SystemProperties``).
SYSTEM_PROPERTIES_ON_THE_WIRE = {
    "$.exp": "absolute-expiry-time",
    "$.cid": "correlationId",
    "$.mid": "messageId",
    "$.to": "to",
    "$.uid": "userId",
    "ack": "ack",
    "$.on": "outputName",
    "$.ct": "contentType",
    "$.ce": "contentEncoding",
    "$.schema": "messageSchema",
    "iothub-operation": "operation",
    "$.ctime": "creationTime",
}


class PropertyBagError(ValueError):
    """A bag that is not ``key=value&...`` URL-encoding; ``reason`` names the refusal counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(slots=True)
class TelemetryTopic:
    device_id: str
    module_id: str | None = None
    output: str | None = None
    application: list[tuple[str, str]] = field(default_factory=list)
    system: dict[str, str] = field(default_factory=dict)  # system property name -> value, from the bag

    @property
    def source(self) -> str:
        """The Edge Hub route source the message comes from."""
        if self.module_id is None:
            return "/messages/events"
        if self.output is None:
            return f"/messages/modules/{self.module_id}"
        return f"/messages/modules/{self.module_id}/outputs/{self.output}"


def parse_property_bag(bag: str) -> list[tuple[str, str]]:
    """``a=1&b=x%20y`` -> ``[("a", "1"), ("b", "x y")]``; a key without ``=`` has the empty value.

    Percent-decoding only (``+`` stays a plus, as in the SDKs' encoders, which write a space as ``%20``);
    empty pieces (``a=1&&b=2``, a trailing ``&``) are skipped. A repeated key or an empty key is an error:
    which one IoT Hub would keep is not specified, and guessing would route the message by chance. So is
    a piece whose bytes are not UTF-8 once decoded (``a=%FF%FE``).
    """
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for piece in bag.split("&"):
        if not piece:
            continue
        raw_key, _, raw_value = piece.partition("=")
        try:
            key, value = unquote(raw_key, errors="strict"), unquote(raw_value, errors="strict")
        except UnicodeDecodeError:
            raise PropertyBagError("bag_not_utf8", f"{piece[:200]!r} is not UTF-8 once decoded") from None
        if not key:
            raise PropertyBagError("empty_property_name", f"empty property name in {piece[:200]!r}")
        if key in seen:
            raise PropertyBagError("repeated_property", f"property {key[:200]!r} given twice")
        seen.add(key)
        pairs.append((key, value))
    return pairs


def _is_bag(segment: str) -> bool:
    return "=" in segment or "&" in segment


def parse_telemetry_topic(topic: str) -> TelemetryTopic | None:
    """The sender and properties a telemetry topic carries; None for topics that are not telemetry.
    A telemetry topic whose bag does not decode raises ``InvalidMessage`` (refused with 0x90, counted)."""
    parts = topic.split("/")
    if len(parts) < 4 or parts[0] != "devices" or not parts[1]:
        return None
    device = parts[1]
    if len(parts) == 6 and parts[2] == "modules" and parts[4] == "outputs" and parts[3] and parts[5]:
        return TelemetryTopic(device, parts[3], parts[5])
    if parts[2:4] == ["messages", "events"]:
        module, rest = None, parts[4:]
    elif len(parts) >= 6 and parts[2] == "modules" and parts[3] and parts[4:6] == ["messages", "events"]:
        module, rest = parts[3], parts[6:]
    else:
        return None
    if rest and rest[-1] == "":
        rest = rest[:-1]  # Edge Hub's templates end in "/"; device SDKs send both forms
    output = None
    if module is None and rest and not _is_bag(rest[0]):
        if not rest[0]:
            return None
        output, rest = rest[0], rest[1:]  # this gateway's .../events/{output}
    bag = "/".join(rest)
    if rest and not _is_bag(bag):
        return None
    try:
        pairs = parse_property_bag(bag)
    except PropertyBagError as exc:
        raise InvalidMessage(exc.reason, TOPIC_NAME_INVALID, f"property bag: {exc}") from None
    parsed = TelemetryTopic(device, module, output)
    for key, value in pairs:
        system = SYSTEM_PROPERTIES_ON_THE_WIRE.get(key)
        if system is None:
            parsed.application.append((key, value))
        else:
            parsed.system[system] = value
    if "outputName" in parsed.system:
        if output is not None and parsed.system["outputName"] != output:
            # Two different output names: which route source it is would be a guess.
            raise InvalidMessage("output_conflict", TOPIC_NAME_INVALID,
                                 f"output {output[:200]!r} in the topic and {parsed.system['outputName'][:200]!r} in $.on")
        parsed.output = parsed.system.pop("outputName")
    return parsed
