"""Every conformance vector against the gateway's codecs: the broker's MQTT codec, the state store's RESP3,
HLC and notification code.

Decoding runs the bytes through ``PacketReader`` twice, whole and one byte per ``feed``: both must give the
vector's packet, error or "incomplete". Valid vectors are also encoded from their fields and compared byte
for byte, unless the vector says ``"encode": false`` (the spec allows a longer form than the one we send).
A vector whose ``differs`` names ``host`` records a documented difference: the test then asserts that the
codec still differs, so the note goes when the difference does.
"""

from __future__ import annotations

from typing import Any

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons
from appliance.broker.codec.packets import MQTT_5, MQTT_311
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.reasons import (
    V311_CONNACK_CODES,
    V311_CONNACK_REASONS,
    MqttProtocolError,
)
from appliance.broker.codec.writer import encode
from appliance.statestore import resp3
from appliance.statestore.client import UnexpectedResponse
from appliance.statestore.client.results import parse_notification
from appliance.statestore.hlc import Hlc, HlcFormatError
from appliance.statestore.notify import notification_topic
from tests.conformance import canonical
from tests.conformance.canonical import HLC, MQTT, PROPERTY_IDS, PROPERTY_NAMES, RESP3, STATESTORE, as_bytes, check, hexed, params

# --- MQTT ----------------------------------------------------------------------------------------------


def host_properties(properties: dict[int, Any]) -> list[list[Any]]:
    pairs: list[list[Any]] = []
    for ident, value in properties.items():
        for item in value if ident in pr.REPEATABLE else (value,):
            if isinstance(item, bytes):
                item = hexed(item)
            pairs.append([PROPERTY_NAMES[ident], list(item) if isinstance(item, tuple) else item])
    return canonical.canonical_properties(pairs)


def host_to_canonical(packet: pk.Packet, version: int) -> dict[str, Any]:
    """A decoded packet in the vectors' canonical form."""
    fields: dict[str, Any]
    match packet:
        case pk.Connect():
            will = None
            if packet.will is not None:
                will = {"topic": packet.will.topic, "payload": hexed(packet.will.payload), "qos": packet.will.qos,
                        "retain": packet.will.retain, "properties": host_properties(packet.will.properties)}
            fields = {"type": "CONNECT", "protocol_name": packet.protocol_name, "protocol_version": packet.protocol_level,
                      "clean_start": packet.clean_start, "keep_alive": packet.keep_alive, "client_id": packet.client_id,
                      "username": packet.username,
                      "password": None if packet.password is None else hexed(packet.password), "will": will}
        case pk.Connack():
            fields = {"type": "CONNACK", "session_present": packet.session_present, "reason_code": packet.reason_code}
            if version == 4:
                fields["return_code"] = V311_CONNACK_CODES[packet.reason_code]
        case pk.Publish():
            fields = {"type": "PUBLISH", "topic": packet.topic, "payload": hexed(packet.payload), "qos": packet.qos,
                      "retain": packet.retain, "dup": packet.dup, "packet_id": packet.packet_id}
        case pk.PubAck() | pk.PubRec() | pk.PubRel() | pk.PubComp():
            fields = {"type": type(packet).__name__.upper(), "packet_id": packet.packet_id, "reason_code": packet.reason_code}
        case pk.Subscribe():
            fields = {"type": "SUBSCRIBE", "packet_id": packet.packet_id,
                      "subscriptions": [request._asdict() for request in packet.subscriptions]}
        case pk.Suback() | pk.Unsuback():
            fields = {"type": type(packet).__name__.upper(), "packet_id": packet.packet_id,
                      "reason_codes": list(packet.reason_codes)}
        case pk.Unsubscribe():
            fields = {"type": "UNSUBSCRIBE", "packet_id": packet.packet_id, "topic_filters": list(packet.topic_filters)}
        case pk.PingReq() | pk.PingResp():
            fields = {"type": type(packet).__name__.upper()}
        case pk.Disconnect() | pk.Auth():
            fields = {"type": type(packet).__name__.upper(), "reason_code": packet.reason_code}
    if hasattr(packet, "properties"):
        fields["properties"] = host_properties(packet.properties)
    return canonical.for_version(fields, version)


def host_property_dict(pairs: list[list[Any]]) -> dict[int, Any]:
    properties: dict[int, Any] = {}
    for name, value in pairs:
        ident = PROPERTY_IDS[name]
        if isinstance(value, dict):
            value = as_bytes(value)
        elif isinstance(value, list):
            value = tuple(value)
        if ident in pr.REPEATABLE:
            properties.setdefault(ident, []).append(value)
        else:
            properties[ident] = value
    return properties


def canonical_to_host(fields: dict[str, Any]) -> pk.Packet:
    """The broker codec's packet object for a vector's (canonical, defaults filled) fields."""
    kind = fields["type"]
    properties = host_property_dict(fields.get("properties", []))
    if kind == "CONNECT":
        will = None
        if fields["will"] is not None:
            spec = fields["will"]
            will = pk.Will(spec["topic"], as_bytes(spec["payload"]), spec["qos"], spec["retain"],
                           host_property_dict(spec.get("properties", [])))
        password = None if fields["password"] is None else as_bytes(fields["password"])
        return pk.Connect(fields["protocol_version"], fields["client_id"], fields["clean_start"], fields["keep_alive"],
                          fields["username"], password, will, properties, fields["protocol_name"])
    if kind == "CONNACK":
        reason = V311_CONNACK_REASONS[fields["return_code"]] if "return_code" in fields else fields["reason_code"]
        return pk.Connack(fields["session_present"], reason, properties)
    if kind == "PUBLISH":
        return pk.Publish(fields["topic"], as_bytes(fields["payload"]), fields["qos"], fields["retain"], fields["dup"],
                          fields["packet_id"], properties)
    if kind in ("PUBACK", "PUBREC", "PUBREL", "PUBCOMP"):
        ack = {"PUBACK": pk.PubAck, "PUBREC": pk.PubRec, "PUBREL": pk.PubRel, "PUBCOMP": pk.PubComp}[kind]
        return ack(fields["packet_id"], fields.get("reason_code", 0), properties)
    if kind == "SUBSCRIBE":
        return pk.Subscribe(fields["packet_id"], [pk.SubscribeRequest(**request) for request in fields["subscriptions"]],
                            properties)
    if kind == "SUBACK":
        return pk.Suback(fields["packet_id"], fields["reason_codes"], properties)
    if kind == "UNSUBSCRIBE":
        return pk.Unsubscribe(fields["packet_id"], fields["topic_filters"], properties)
    if kind == "UNSUBACK":
        return pk.Unsuback(fields["packet_id"], fields.get("reason_codes", []), properties)
    if kind in ("DISCONNECT", "AUTH"):
        return (pk.Disconnect if kind == "DISCONNECT" else pk.Auth)(fields.get("reason_code", 0), properties)
    return pk.PingReq() if kind == "PINGREQ" else pk.PingResp()


def reader_outcome(version: int, chunks: list[bytes]) -> dict[str, Any]:
    reader = PacketReader(protocol_level=MQTT_5 if version == 5 else MQTT_311)
    packets: list[pk.Packet] = []
    try:
        for chunk in chunks:
            packets += reader.feed(chunk)
    except MqttProtocolError as exc:
        return {"error": exc.reason_code}
    if not packets:
        return {"incomplete": True}
    assert len(packets) == 1 and len(reader.pending) == 0, "a vector holds exactly one packet"
    return {"packet": host_to_canonical(packets[0], version)}


def expected_outcome(vector: dict[str, Any]) -> dict[str, Any]:
    if "error" in vector:
        return {"error": getattr(reasons, vector["error"].upper())}
    if vector.get("incomplete"):
        return {"incomplete": True}
    return {"packet": canonical.expected_packet(vector)}


@pytest.mark.parametrize("vector", params(MQTT["vectors"]))
def test_mqtt_decode(vector: dict[str, Any]) -> None:
    data = canonical.wire(vector)
    whole = reader_outcome(vector["version"], [data])
    byte_by_byte = reader_outcome(vector["version"], [data[i : i + 1] for i in range(len(data))])
    assert whole == byte_by_byte
    check(vector, "host", whole, expected_outcome(vector))


ENCODABLE = [vector for vector in MQTT["vectors"] if "packet" in vector and vector.get("encode", True)]


@pytest.mark.parametrize("vector", params(ENCODABLE))
def test_mqtt_encode(vector: dict[str, Any]) -> None:
    packet = canonical_to_host(canonical.expected_packet(vector, wire_order=True))
    level = MQTT_5 if vector["version"] == 5 else MQTT_311
    assert encode(packet, level).hex(" ") == canonical.wire(vector).hex(" ")


# --- RESP3 ---------------------------------------------------------------------------------------------


def host_resp3(value: resp3.Value) -> Any:
    match value:
        case resp3.SimpleString():
            return {"simple": value.text.decode("utf-8")}
        case resp3.ErrorReply():
            return {"error": value.text.decode("utf-8")}
        case bool():
            raise AssertionError("RESP3 booleans are not in the state store's subset")
        case int():
            return {"integer": value}
        case bytes():
            return {"bulk_hex": value.hex()}
        case None:
            return None
        case list():
            return [host_resp3(item) for item in value]


def host_resp3_encode(value: Any) -> bytes:
    """The gateway's encoder for a canonical value: the replies it sends and the arrays of its notifications."""
    if value is None:
        return resp3.encode_bulk(None)
    if isinstance(value, list):
        assert all(isinstance(item, dict) and "bulk_hex" in item for item in value), "only arrays of bulk strings"
        return resp3.encode_array([bytes.fromhex(item["bulk_hex"]) for item in value])
    if "simple" in value:
        return resp3.encode_simple(value["simple"].encode("utf-8"))
    if "error" in value:
        assert value["error"].startswith("ERR "), "the gateway sends '-ERR <message>' only"
        return resp3.encode_error(value["error"].removeprefix("ERR "))
    if "integer" in value:
        return resp3.encode_integer(value["integer"])
    return resp3.encode_bulk(bytes.fromhex(value["bulk_hex"]))


@pytest.mark.parametrize("vector", params(RESP3["vectors"]))
def test_resp3_decode(vector: dict[str, Any]) -> None:
    data = canonical.wire(vector)
    try:
        outcome: Any = {"value": host_resp3(resp3.decode(data))}
    except resp3.Resp3Error:
        outcome = {"error": True}
    expected = {"error": True} if vector.get("error") else {"value": canonical.resp3_value(vector)}
    check(vector, "host", outcome, expected)


@pytest.mark.parametrize("vector", params([v for v in RESP3["vectors"] if not v.get("error") and v.get("encode", True)]))
def test_resp3_encode(vector: dict[str, Any]) -> None:
    assert host_resp3_encode(canonical.resp3_value(vector)) == canonical.wire(vector)


# --- HLC -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", params(HLC["vectors"]))
def test_hlc_parse(vector: dict[str, Any]) -> None:
    try:
        parsed = Hlc.parse(vector["text"])
        outcome: Any = {"hlc": [parsed.wall_ms, parsed.counter, parsed.node_id]}
    except HlcFormatError:
        outcome = {"error": True}
    check(vector, "host", outcome, {"error": True} if vector.get("error") else {"hlc": vector["hlc"]})


@pytest.mark.parametrize("vector", params([v for v in HLC["vectors"] if "hlc" in v and v.get("encode", True)]))
def test_hlc_format(vector: dict[str, Any]) -> None:
    assert str(Hlc(*vector["hlc"])) == vector["text"]


# --- State store topics and notifications ---------------------------------------------------------------


@pytest.mark.parametrize("vector", params(STATESTORE["notify_topics"]))
def test_notify_topic(vector: dict[str, Any]) -> None:
    assert notification_topic(vector["client_id"], as_bytes(vector["key"])) == vector["topic"]


@pytest.mark.parametrize("vector", params(STATESTORE["notifications"]))
def test_notification(vector: dict[str, Any]) -> None:
    """The payload's meaning (the gateway's client takes the key from the topic before this)."""
    key = as_bytes(vector["notification"]["key"]) if "notification" in vector else b"k"
    try:
        note = parse_notification(key, canonical.wire(vector, "payload"), None)
        outcome: Any = {"key": key, "operation": "DELETE" if note.value is None else "SET",
                        "value": None if note.value is None else hexed(note.value)}
    except (UnexpectedResponse, resp3.Resp3Error):
        outcome = {"error": True}
    expected: Any = {"error": True}
    if "notification" in vector:
        expected = dict(vector["notification"], key=key)
    check(vector, "host", outcome, expected)
