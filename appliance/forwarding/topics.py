"""Device telemetry topics, as IoT Hub and Edge Hub's MQTT head read them, plus this gateway's own forms.

Azure IoT device SDKs - and any MQTT 3.1.1 device, which has no user properties - put a message's
properties in the topic: ``devices/{deviceId}/messages/events/{property_bag}``, the bag URL-encoded
``key=value&key2=value2``. Edge Hub's MQTT head accepts the same for modules,
``devices/{deviceId}/modules/{moduleId}/messages/events/{property_bag}``, with the output name in the bag
(``$.on``), and tolerates a trailing ``/``. Keys of the form ``$.xx`` (and ``ack``, ``iothub-operation``)
are system properties, mapped to their names as Edge Hub's ``SystemProperties.IncomingSystemPropertiesMap``
does; every other key is an application property.

A bag is read as Edge Hub reads it: a repeated key keeps its last value (the protocol gateway's URL
decoder assigns into a dictionary), and a bag naming one application property in two cases
(``Alert=true&alert=false``) is refused - Edge Hub copies the properties into a case-insensitive
dictionary (``EdgeMessage``), which throws, so the device's publish fails; routing on whichever copy a
lookup met first would decide the route by position. A refused bag raises ``PropertyBagError`` with a
short ``reason``; the caller answers the device with a reason code.

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
    "$.ifid": "iothub-interface-id",
    "$.sub": "dt-subject",
}


class PropertyBagError(InvalidMessage):
    """A bag the gateway refuses rather than guess at. Like every value that came in the topic it is
    refused with 0x90 (Topic Name invalid); ``reason`` names the kind (the key of the forwarding
    ``refused`` counter), the message the case."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, TOPIC_NAME_INVALID, message)


#: ``PropertyBagError.reason`` values.
BAG_EMPTY_NAME = "empty_property_name"
BAG_NOT_UTF8 = "bag_not_utf8"
BAG_CASE_DUPLICATE = "property_in_two_cases"
BAG_TWO_OUTPUTS = "output_conflict"


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
    empty pieces (``a=1&&b=2``, a trailing ``&``) are skipped; a repeated key keeps its first place and
    its last value, as Edge Hub's decoder does. An empty key or a name that is not UTF-8 after decoding
    raises ``PropertyBagError``.
    """
    pairs: dict[str, str] = {}
    for piece in bag.split("&"):
        if not piece:
            continue
        raw_key, _, raw_value = piece.partition("=")
        try:
            key, value = unquote(raw_key, errors="strict"), unquote(raw_value, errors="strict")
        except UnicodeDecodeError as exc:
            raise PropertyBagError(BAG_NOT_UTF8, f"{piece[:200]!r} is not UTF-8 after percent-decoding") from exc
        if not key:
            raise PropertyBagError(BAG_EMPTY_NAME, f"empty property name in {piece[:200]!r}")
        pairs[key] = value
    return list(pairs.items())


def _refuse_case_duplicates(application: list[tuple[str, str]]) -> None:
    seen: dict[str, str] = {}
    for key, _ in application:
        first = seen.setdefault(key.lower(), key)
        if first != key:
            raise PropertyBagError(BAG_CASE_DUPLICATE, f"property {first[:200]!r} given twice, also as {key[:200]!r}: "
                                   "names are case-insensitive, so which value routes would be a guess")


def _is_bag(segment: str) -> bool:
    return "=" in segment or "&" in segment


def parse_telemetry_topic(topic: str) -> TelemetryTopic | None:
    """The sender and properties a telemetry topic carries; None for topics that are not telemetry.
    A telemetry topic whose bag the gateway refuses raises ``PropertyBagError`` (an ``InvalidMessage``:
    refused with 0x90, counted)."""
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
    parsed = TelemetryTopic(device, module, output)
    for key, value in parse_property_bag(bag):
        system = SYSTEM_PROPERTIES_ON_THE_WIRE.get(key)
        if system is None:
            parsed.application.append((key, value))
        else:
            parsed.system[system] = value
    _refuse_case_duplicates(parsed.application)
    if "outputName" in parsed.system:
        if output is not None and parsed.system["outputName"] != output:
            raise PropertyBagError(BAG_TWO_OUTPUTS, f"output {output[:200]!r} in the topic but $.on={parsed.system['outputName'][:200]!r} "
                                   "in the bag: which route source applies would be a guess")
        parsed.output = parsed.system.pop("outputName")
    return parsed
