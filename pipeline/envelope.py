"""From one upstream MQTT message to landing-zone records, or to quarantine records with the reason.

No I/O here: the ingest feeds it what paho received and writes what it returns, so every rule about what
the cloud accepts is in this file and is tested without a broker. The message format it reads is
``docs/message-format.md`` (topic, ``gw-*`` user properties, metrics messages, upstream batches); the
record it writes is ``pipeline.records.LANDING_FIELDS``, documented in ``docs/pipeline.md`` and mirrored by
``pipeline.jobs.schemas.LANDING``.

``land_all`` is the ingest's entry point: a batch PUBLISH becomes one record per message in it, anything
else one record (``land``). Each message of a batch is landed as the one-message PUBLISH it stands for
(same ``gw-*`` identity, same checks), so a record does not depend on the format the gateway chose.

The ingest only checks what it needs to land a message: the gateway's envelope (the ``gw-*`` properties)
and, for JSON content, that the payload parses. Whether telemetry fits the thermostat schema is the Spark
job's call (``pipeline.jobs.telemetry``), so one schema lives in one place.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from paho.mqtt.client import topic_matches_sub

from pipeline.records import (
    DEFAULT_BATCH_FILTER,
    DEFAULT_METRICS_FILTER,
    EVENTS,
    FIRMWARE,
    FIRMWARE_OUTPUT,
    LANDING_FIELDS,
    METRICS,
    QUARANTINE,
)

if TYPE_CHECKING:
    from appliance.forwarding.batch import Batch

# gw-* user property -> (landing field, parser, required)
GATEWAY_PROPERTIES = {
    "gw-message-id": ("message_id", str, True),
    "gw-gateway-id": ("gateway_id", str, True),
    "gw-device-id": ("device_id", str, True),
    "gw-module-id": ("module_id", str, False),
    "gw-output": ("output", str, False),
    "gw-priority": ("priority", int, True),
    "gw-enqueued-ms": ("enqueued_ms", int, True),
    "gw-sent-ms": ("sent_ms", int, True),
    "gw-ttl-s": ("ttl_s", int, True),
}
# The device's own user properties that the gateway turns into system properties ($contentEncoding,
# $messageId). Both formats carry them (the one-message format as user properties of these names, after
# the application properties); they land in ``properties`` under these, their original names.
CONTENT_ENCODING_PROPERTY = "content-encoding"
DEVICE_MESSAGE_ID_PROPERTY = "message-id"


@dataclass(frozen=True)
class Incoming:
    """What the ingest knows about one received PUBLISH."""

    topic: str
    payload: bytes
    received_ms: int
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    content_type: str | None = None
    redelivered: bool = False


@dataclass(frozen=True)
class Landed:
    kind: str  # one of KINDS
    record: dict


class Rejected(ValueError):
    """A message that cannot be landed as what it claims to be; the text is the quarantine reason."""


def land(message: Incoming, metrics_filter: str = DEFAULT_METRICS_FILTER) -> Landed:
    """The landing record for ``message``; never raises: what cannot be landed goes to quarantine."""
    if topic_matches_sub(metrics_filter, message.topic):
        try:
            return Landed(METRICS, _metrics_record(message))
        except Rejected as rejected:
            return Landed(QUARANTINE, quarantine_record(message, str(rejected)))
    return _land_event(message)


def _land_event(message: Incoming) -> Landed:
    try:
        record = _event_record(message)
    except Rejected as rejected:
        return Landed(QUARANTINE, quarantine_record(message, str(rejected)))
    return Landed(FIRMWARE if is_update_status(record) else EVENTS, record)


def is_update_status(record: dict) -> bool:
    """A thermostat's update status: its own output (``update``), or, from firmware that sent it on
    ``data``, a JSON object with an ``update`` and no ``ts_ms`` (it is no reading: the updater runs
    instead of the thermostat). Such messages are the ``firmware`` kind, not bad readings."""
    if record["output"] == FIRMWARE_OUTPUT:
        return True
    payload = record["payload"]
    if record["output"] != "data" or payload is None or '"update"' not in payload:
        return False
    try:
        document = json.loads(payload)
    except ValueError:
        return False
    return isinstance(document, dict) and isinstance(document.get("update"), dict) and "ts_ms" not in document


def land_all(message: Incoming, metrics_filter: str = DEFAULT_METRICS_FILTER,
             batch_filter: str = DEFAULT_BATCH_FILTER) -> list[Landed]:
    """The landing records of ``message``: one per message of a batch, else the one ``land`` gives."""
    if topic_matches_sub(batch_filter, message.topic):
        return land_batch(message, batch_filter)
    return [land(message, metrics_filter)]


def land_batch(message: Incoming, batch_filter: str = DEFAULT_BATCH_FILTER) -> list[Landed]:
    """One landing record per message of the batch PUBLISH ``message``; never raises.

    Each message lands exactly as the one-message PUBLISH with the same identity would (``as_messages``),
    so a message that fails a check (priority, JSON) goes to quarantine on its own and the others land.
    A payload that is not a batch at all, or holds no message, becomes one quarantine record, raw.
    """
    # Imported here: the ingest needs it only for batches.
    from appliance.forwarding.batch import BatchFormatError, decode_batch

    try:
        batch = decode_batch(message.payload)
    except BatchFormatError as error:
        return [Landed(QUARANTINE, batch_quarantine_record(message, f"malformed batch: {error}", batch_filter))]
    if not batch.records:
        return [Landed(QUARANTINE, batch_quarantine_record(message, "empty batch: no messages", batch_filter))]
    return [_land_event(one) for one in as_messages(message, batch)]


def as_messages(message: Incoming, batch: Batch) -> list[Incoming]:
    """The one-message PUBLISHes (docs/message-format.md, "Upstream") that ``batch`` stands for.

    Topic, receive time and DUP flag are the batch PUBLISH's; the ``gw-*`` properties, content type and
    payload are each message's; the device's ``content-encoding`` and ``message-id`` follow its application
    properties, where the one-message format puts them.
    """
    from appliance.forwarding.batch import record_properties  # see land_batch

    out = []
    for record in batch.records:
        source = record.source
        props = record_properties(batch, record)
        if source.content_encoding is not None:
            props.append((CONTENT_ENCODING_PROPERTY, source.content_encoding))
        if record.device_message_id is not None:
            props.append((DEVICE_MESSAGE_ID_PROPERTY, record.device_message_id))
        out.append(Incoming(message.topic, record.payload, message.received_ms, props, source.content_type,
                            message.redelivered))
    return out


def batch_quarantine_record(message: Incoming, reason: str, batch_filter: str = DEFAULT_BATCH_FILTER) -> dict:
    """A batch PUBLISH that cannot be read: the raw payload, always as base64 (the format is binary)."""
    record = quarantine_record(message, reason)
    record["gateway_id"] = record["gateway_id"] or _gateway_from_topic(message.topic, batch_filter)
    record["payload"], record["payload_base64"] = None, base64.b64encode(message.payload).decode("ascii")
    return record


def quarantine_record(message: Incoming, reason: str) -> dict:
    """Everything the message carried, raw, so it can be replayed once the reason is fixed."""
    record = _blank(message)
    props = dict(message.user_properties)
    record["message_id"] = props.get("gw-message-id")
    record["gateway_id"] = props.get("gw-gateway-id")
    record["device_id"] = props.get("gw-device-id")
    record["properties"] = props
    record["payload"], record["payload_base64"] = _payload_fields(message.payload)
    record["reason"] = reason
    return record


def decode_payload(record: dict) -> bytes:
    """The exact bytes the device published, from a landing record."""
    if record.get("payload_base64") is not None:
        return base64.b64decode(record["payload_base64"])
    return (record.get("payload") or "").encode("utf-8")


def _blank(message: Incoming) -> dict:
    record = dict.fromkeys(LANDING_FIELDS)
    record["received_ms"] = message.received_ms
    record["topic"] = message.topic
    record["content_type"] = message.content_type
    record["redelivered"] = message.redelivered
    return record


def _event_record(message: Incoming) -> dict:
    record = _blank(message)
    own: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in message.user_properties:
        spec = GATEWAY_PROPERTIES.get(name)
        if spec is None:
            own[name] = value  # the device's own application properties, kept as they came
            continue
        target, parse, _ = spec
        try:
            record[target] = parse(value)
        except ValueError:
            raise Rejected(f"user property {name} is not an integer: {value!r}") from None
        seen.add(name)
    missing = [name for name, (_, _, required) in GATEWAY_PROPERTIES.items() if required and name not in seen]
    if missing:
        raise Rejected("missing user properties: " + ", ".join(missing))
    if not 0 <= record["priority"] <= 10:
        raise Rejected(f"gw-priority out of range 0-10: {record['priority']}")
    record["properties"] = own
    record["payload"], record["payload_base64"] = _payload_fields(message.payload)
    if _is_json(message.content_type):
        _require_json(message.payload)
    return record


def _metrics_record(message: Incoming) -> dict:
    document = _require_json(message.payload, finite=True)
    if not isinstance(document, dict):
        raise Rejected("metrics payload is not a JSON object")
    gateway_id, ts_ms = document.get("gateway_id"), document.get("ts_ms")
    if not isinstance(gateway_id, str) or not gateway_id:
        raise Rejected("metrics payload has no gateway_id")
    if not isinstance(ts_ms, int) or isinstance(ts_ms, bool):
        raise Rejected("metrics payload has no integer ts_ms")
    if not isinstance(document.get("endpoints"), dict):
        raise Rejected("metrics payload has no endpoints object")
    record = _blank(message)
    # A gateway sends one metrics message per interval: (gateway, ts_ms) names it across redeliveries.
    record["message_id"] = f"{gateway_id}:metrics:{ts_ms}"
    record["gateway_id"] = gateway_id
    record["sent_ms"] = ts_ms
    record["properties"] = dict(message.user_properties)
    record["payload"] = message.payload.decode("utf-8")
    return record


def _gateway_from_topic(topic: str, batch_filter: str) -> str | None:
    """The topic level at the filter's first ``+`` (``gateways/+/batches``: the gateway id), if any."""
    filter_levels, levels = batch_filter.split("/"), topic.split("/")
    if "+" not in filter_levels:
        return None
    at = filter_levels.index("+")
    return (levels[at] or None) if at < len(levels) else None


def _payload_fields(payload: bytes) -> tuple[str | None, str | None]:
    try:
        return payload.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, base64.b64encode(payload).decode("ascii")


def _reject_constant(name: str):
    raise Rejected(f"metrics payload has a number that is not finite: {name}")


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _require_json(payload: bytes, finite: bool = False):
    """The parsed payload. ``finite``: reject NaN and +-Infinity, which Python's ``json.dumps`` writes but
    JSON has not. Telemetry keeps them (the job quarantines such a reading with the field's name), metrics
    do not: a counter or gauge that is not a number would be read as a reset or a maximum."""
    try:
        return json.loads(payload.decode("utf-8"), parse_constant=_reject_constant if finite else None)
    except UnicodeDecodeError:
        raise Rejected("payload is not UTF-8") from None
    except json.JSONDecodeError as error:
        raise Rejected(f"payload is not valid JSON: {error.msg} at char {error.pos}") from None
