"""The conformance vectors (``vectors/*.json``) and their canonical forms, shared by both runners.

A vector states what the specification says about some bytes; each runner turns what its codec made of
them into the same canonical JSON-shaped value and compares. Canonical forms (README.md has the full list):
bytes are ``{"hex": ...}``, MQTT properties are ``[name, value]`` pairs in property-id order (repeatable
ones keep their wire order), fields a vector leaves out take the defaults below.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

DIRECTORY = Path(__file__).resolve().parent / "vectors"


def load(name: str) -> dict[str, Any]:
    return json.loads((DIRECTORY / f"{name}.json").read_text(encoding="utf-8"))


MQTT = load("mqtt")
RESP3 = load("resp3")
HLC = load("hlc")
STATESTORE = load("statestore")

PROPERTY_IDS: dict[str, int] = {name: int(ident, 16) for name, ident in MQTT["property_ids"].items()}
PROPERTY_NAMES: dict[int, str] = {ident: name for name, ident in PROPERTY_IDS.items()}


def params(vectors: list[dict[str, Any]]) -> list[Any]:
    """One pytest parameter per vector, named by its id."""
    return [pytest.param(vector, id=vector["id"]) for vector in vectors]


def wire(vector: dict[str, Any], text: str = "wire") -> bytes:
    """The bytes of a vector: ``hex`` (spaces allowed), ``<text>_hex``, or ``<text>`` as UTF-8 text."""
    if "hex" in vector:
        return bytes.fromhex(vector["hex"])
    if f"{text}_hex" in vector:
        return bytes.fromhex(vector[f"{text}_hex"])
    return str(vector[text]).encode("utf-8")


def as_bytes(value: str | dict[str, str]) -> bytes:
    """A bytes value as vectors write it: ``{"hex": ...}`` or plain text (UTF-8)."""
    if isinstance(value, dict):
        return bytes.fromhex(value["hex"])
    return value.encode("utf-8")


def hexed(data: bytes) -> dict[str, str]:
    return {"hex": bytes(data).hex()}


# --- MQTT ----------------------------------------------------------------------------------------------

_V5_ONLY = {"properties"}
_ACK_TYPES = ("PUBACK", "PUBREC", "PUBREL", "PUBCOMP")
_DEFAULTS: dict[str, dict[str, Any]] = {
    "CONNECT": {"protocol_name": "MQTT", "clean_start": True, "username": None, "password": None, "will": None,
                "properties": []},
    "CONNACK": {"session_present": False, "reason_code": 0, "properties": []},
    "PUBLISH": {"payload": {"hex": ""}, "qos": 0, "retain": False, "dup": False, "packet_id": None, "properties": []},
    **{ack: {"reason_code": 0, "properties": []} for ack in _ACK_TYPES},
    "SUBSCRIBE": {"properties": []},
    "SUBACK": {"properties": []},
    "UNSUBSCRIBE": {"properties": []},
    "UNSUBACK": {"reason_codes": [], "properties": []},
    "PINGREQ": {},
    "PINGRESP": {},
    "DISCONNECT": {"reason_code": 0, "properties": []},
    "AUTH": {"reason_code": 0, "properties": []},
}
_REQUIRED: dict[str, set[str]] = {
    "CONNECT": {"client_id", "keep_alive"},
    "PUBLISH": {"topic"},
    **{ack: {"packet_id"} for ack in _ACK_TYPES},
    "SUBSCRIBE": {"packet_id", "subscriptions"},
    "SUBACK": {"packet_id", "reason_codes"},
    "UNSUBSCRIBE": {"packet_id", "topic_filters"},
    "UNSUBACK": {"packet_id"},
}
#: What MQTT 3.1.1 has no field for: properties everywhere, reason codes outside CONNACK and SUBACK.
_NOT_IN_311: dict[str, set[str]] = {
    **{kind: {"properties"} for kind in _DEFAULTS},
    **{ack: {"properties", "reason_code"} for ack in _ACK_TYPES},
    "UNSUBACK": {"properties", "reason_codes"},
    "DISCONNECT": {"properties", "reason_code"},
    "CONNACK": {"properties", "reason_code"},
}


def canonical_properties(pairs: list[list[Any]]) -> list[list[Any]]:
    """``[name, value]`` pairs sorted by property id; the sort is stable, so repeated ones keep their order."""
    for name, _ in pairs:
        if name not in PROPERTY_IDS:
            raise ValueError(f"unknown property name {name!r}")
    return sorted(([name, list(value) if isinstance(value, tuple) else value] for name, value in pairs),
                  key=lambda pair: PROPERTY_IDS[pair[0]])


def expected_packet(vector: dict[str, Any], wire_order: bool = False) -> dict[str, Any]:
    """The packet a valid vector describes, every field present (the defaults filled in). Properties are in
    canonical order, or with ``wire_order`` as the vector lists them (the order an encoder must keep)."""
    fields = dict(vector["packet"])
    kind = fields["type"]
    version = vector["version"]
    missing = _REQUIRED.get(kind, set()) - fields.keys()
    if missing:
        raise ValueError(f"{vector['id']}: {kind} needs {sorted(missing)}")
    allowed = {"type"} | _REQUIRED.get(kind, set()) | _DEFAULTS[kind].keys()
    if version == 4:
        allowed -= _NOT_IN_311[kind]
        if kind == "CONNACK":
            allowed |= {"return_code"}
    unknown = fields.keys() - allowed
    if unknown:
        raise ValueError(f"{vector['id']}: {kind} has no field(s) {sorted(unknown)} in version {version}")
    packet = {key: value for key, value in _DEFAULTS[kind].items() if key in allowed} | fields
    if kind == "CONNECT":
        packet["protocol_version"] = version
        if packet["will"] is not None:
            will = {"qos": 0, "retain": False, "properties": []} | packet["will"]
            if version == 4:
                del will["properties"]
            packet["will"] = will
    if kind == "SUBSCRIBE":
        defaults = {"no_local": False, "retain_as_published": False, "retain_handling": 0} if version == 5 else {}
        packet["subscriptions"] = [defaults | request for request in packet["subscriptions"]]
    return packet if wire_order else canonicalised(packet)


def canonicalised(packet: dict[str, Any]) -> dict[str, Any]:
    """Properties sorted (also in a will), tuples as lists: the form both runners report."""
    packet = dict(packet)
    if "properties" in packet:
        packet["properties"] = canonical_properties(packet["properties"])
    if packet.get("will") and "properties" in packet["will"]:
        packet["will"] = dict(packet["will"], properties=canonical_properties(packet["will"]["properties"]))
    return packet


# --- RESP3 ---------------------------------------------------------------------------------------------


def resp3_value(vector: dict[str, Any]) -> Any:
    """The canonical value of a RESP3 vector; a ``command`` is an array of bulk strings."""
    if "command" in vector:
        return [{"bulk_hex": as_bytes(arg).hex()} for arg in vector["command"]]
    return canonical_resp3(vector["value"])


def canonical_resp3(value: Any) -> Any:
    """``{"bulk": text}`` becomes ``{"bulk_hex": ...}``, so both spellings compare equal."""
    if isinstance(value, list):
        return [canonical_resp3(item) for item in value]
    if isinstance(value, dict) and "bulk" in value:
        return {"bulk_hex": value["bulk"].encode("utf-8").hex()}
    return value


def for_version(packet: dict[str, Any], version: int) -> dict[str, Any]:
    """A full (MQTT 5 shaped) canonical packet cut down to the fields ``version`` has."""
    if version == 5:
        return packet
    packet = {key: value for key, value in packet.items() if key not in _NOT_IN_311[packet["type"]]}
    if packet.get("will"):
        packet["will"] = {key: value for key, value in packet["will"].items() if key != "properties"}
    if packet["type"] == "SUBSCRIBE":
        packet["subscriptions"] = [{"topic_filter": request["topic_filter"], "qos": request["qos"]}
                                   for request in packet["subscriptions"]]
    return packet


def check(vector: dict[str, Any], side: str, actual: Any, expected: Any) -> None:
    """What ``side`` (``host`` or ``firmware``) decoded or parsed equals the vector, or, for a documented
    difference (the vector's ``differs`` names the side), does not: the note goes when the difference does.
    Encoding has no differences: what is sent is always checked byte for byte."""
    difference = vector.get("differs", {}).get(side)
    if difference is None:
        assert actual == expected
    else:
        assert actual != expected, f"{side} now agrees with the vector: drop its 'differs' note ({difference})"
