"""What a device may hand the gateway for forwarding, and what the gateway may hand a cloud MQTT 5 server.

Why one module for both ends: a device's id, module id, output name and property bag end up in the
upstream PUBLISH - substituted into the topic template (``{device_id}``, ``{module_id}``, ``{output}``) or
sent as user properties - so whatever the cloud would refuse must be refused where it enters, with a reason
code the device sees, and nothing queued. A message the cloud refuses after it was acknowledged to the
device sits at the head of its queue; one the client library refuses to encode (paho raises ``ValueError``
for a ``#`` in a topic) would end the pump. The same rules are checked again right before an upstream
send (``upstream_problem``), so a message stored by an older gateway, a gateway id or a topic template
cannot make a send the server must refuse either.

Rules
-----
MQTT 5 section 1.5.4, and what mosquitto's ``mosquitto_validate_utf8`` enforces (the strictest real server
we know):

* no U+0000, no C0 or C1 control character (U+0001-U+001F, U+007F-U+009F), no surrogate, no Unicode
  non-character (U+FDD0-U+FDEF, U+xxFFFE, U+xxFFFF) in any string;
* a string is at most 65,535 bytes of UTF-8 (the MQTT string length prefix);
* a value that becomes one topic level (device id, module id, output) is not empty, has no ``/`` (it would
  add levels the template did not have), no ``+`` or ``#`` (a PUBLISH topic has no wildcards), and at most
  ``MAX_LEVEL_CHARS`` characters, IoT Hub's limit for device and module ids;
* a property name is not empty.

Each refusal has a short ``reason`` (the per-reason counter of the metrics, ``refused``) and the MQTT 5
reason code the device gets: 0x90 (Topic Name invalid) for what came in the topic - ids, output, the
property bag - and 0x99 (Payload format invalid) for what came in the PUBLISH's properties.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from appliance.broker.api import PAYLOAD_FORMAT_INVALID, TOPIC_NAME_INVALID

#: IoT Hub: "A case-sensitive string (up to 128 characters long)" for device and module ids.
MAX_LEVEL_CHARS = 128
#: An MQTT UTF-8 string's two-byte length prefix.
MAX_STRING_BYTES = 65535

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NONCHARACTER = re.compile("[\ufdd0-\ufdef\ufffe\uffff]")


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a value is not acceptable: ``reason`` names the counter, ``detail`` says which value and how."""

    reason: str
    detail: str


class InvalidMessage(ValueError):
    """A device message refused at ingress: ``reason`` (counted), ``reason_code`` (its PUBACK)."""

    def __init__(self, reason: str, reason_code: int, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.reason_code = reason_code
        self.detail = detail


def _is_noncharacter(text: str) -> bool:
    return bool(_NONCHARACTER.search(text)) or any((ord(c) & 0xFFFE) == 0xFFFE for c in text if ord(c) > 0xFFFF)


def string_problem(what: str, value: str) -> Problem | None:
    """Whether ``value`` may be an MQTT 5 UTF-8 string that any conforming server accepts."""
    if match := _CONTROL.search(value):
        return Problem("control_character", f"{what} holds control character U+{ord(match.group()):04X}")
    if _SURROGATE.search(value):
        return Problem("bad_unicode", f"{what} holds a lone surrogate")
    if _is_noncharacter(value):
        return Problem("bad_unicode", f"{what} holds a Unicode non-character")
    size = len(value.encode("utf-8"))
    if size > MAX_STRING_BYTES:
        return Problem("too_long", f"{what} is {size} bytes of UTF-8, more than {MAX_STRING_BYTES}")
    return None


def level_problem(what: str, value: str) -> Problem | None:
    """Whether ``value`` may stand as one level of an upstream topic name."""
    if not value:
        return Problem("empty_level", f"{what} is empty")
    if "+" in value or "#" in value:
        return Problem("wildcard", f"{what} {value[:MAX_LEVEL_CHARS]!r} holds an MQTT wildcard")
    if "/" in value:
        return Problem("level_separator", f"{what} {value[:MAX_LEVEL_CHARS]!r} holds a '/'")
    if len(value) > MAX_LEVEL_CHARS:
        return Problem("too_long", f"{what} is {len(value)} characters, more than {MAX_LEVEL_CHARS}")
    return string_problem(what, value)


def properties_problem(where: str, properties: Iterable[tuple[str, str]]) -> Problem | None:
    """The first name or value of ``properties`` that cannot be sent on as a user property."""
    for name, value in properties:
        if not name:
            return Problem("empty_property_name", f"{where}: a property has an empty name")
        problem = string_problem(f"{where}: property name {name[:64]!r}", name) or string_problem(
            f"{where}: value of {name[:64]!r}", value)
        if problem is not None:
            return problem
    return None


def check_topic_values(device_id: str, module_id: str | None, output: str | None,
                       bag: Iterable[tuple[str, str]]) -> None:
    """Raise ``InvalidMessage`` (0x90) for a telemetry topic whose values cannot be forwarded."""
    problem = level_problem("device id", device_id)
    if problem is None and module_id is not None:
        problem = level_problem("module id", module_id)
    if problem is None and output is not None:
        problem = level_problem("output name", output)
    if problem is None:
        problem = properties_problem("property bag", bag)
    if problem is not None:
        raise InvalidMessage(problem.reason, TOPIC_NAME_INVALID, problem.detail)


def check_publish_properties(user_properties: Iterable[tuple[str, str]], content_type: str | None) -> None:
    """Raise ``InvalidMessage`` (0x99) for MQTT 5 properties that cannot be forwarded."""
    problem = properties_problem("user property", user_properties)
    if problem is None and content_type is not None:
        problem = string_problem("content type", content_type)
    if problem is not None:
        raise InvalidMessage(problem.reason, PAYLOAD_FORMAT_INVALID, problem.detail)


def _varint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def publish_size(topic: str, payload_size: int, packed_properties: bytes | None) -> int:
    """The exact size of a QoS 1 PUBLISH: fixed header, topic, packet id, properties (MQTT 5), payload.
    ``packed_properties`` is the property block with its length prefix (None for MQTT 3.1.1)."""
    remaining = 2 + len(topic.encode("utf-8")) + 2 + len(packed_properties or b"") + payload_size
    return 1 + _varint_size(remaining) + remaining


def upstream_problem(topic: str, properties: Iterable[tuple[str, str]], content_type: str | None,
                     size: int, max_packet: int | None) -> Problem | None:
    """Why a server could refuse this PUBLISH before reading it (None: it may go out)."""
    if not topic:
        return Problem("empty_level", "the upstream topic is empty")
    if "+" in topic or "#" in topic:
        return Problem("wildcard", f"the upstream topic {topic[:200]!r} holds an MQTT wildcard")
    problem = string_problem("the upstream topic", topic) or properties_problem("upstream", properties)
    if problem is None and content_type is not None:
        problem = string_problem("the content type", content_type)
    if problem is None and max_packet is not None and size > max_packet:
        problem = Problem("packet_too_large",
                          f"a PUBLISH of {size} bytes exceeds the server's Maximum Packet Size of {max_packet}")
    return problem
