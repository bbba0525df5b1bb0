"""The conformance vectors through the firmware's codecs, under the real ``micropython`` binary.

One micropython process runs every case (``mp/run_vectors.py``): this module writes the cases it needs as
one JSON job (the vectors with their defaults filled in), the process prints what the firmware made of
each, and every comparison happens here. The firmware is an MQTT 5 client, so it meets the MQTT 5 vectors
of the packets a client receives (CONNACK, PUBLISH, PUBACK, SUBACK, PINGRESP, DISCONNECT: decoded field by
field, or refused with the vector's reason code) and encodes those a client
sends (CONNECT, PUBLISH, SUBSCRIBE, PUBACK, PINGREQ, DISCONNECT: byte for byte, skipped, with the reason,
where its API cannot say what the vector says). A vector whose ``differs`` names ``firmware`` records a
documented difference (docs/firmware.md): the test then asserts it still differs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from appliance.broker.codec import reasons
from tests.conformance import canonical
from tests.conformance.canonical import HLC, MQTT, PROPERTY_IDS, PROPERTY_NAMES, RESP3, STATESTORE, as_bytes, check, hexed, params
from tests.device_firmware.micropython import FIRMWARE, MICROPYTHON

RUNNER = Path(__file__).resolve().parent / "mp" / "run_vectors.py"

#: What the firmware decodes, and the fields its decoders report (it has no use for PUBLISH's DUP).
FIRMWARE_DECODES = {
    "CONNACK": ("session_present", "reason_code", "properties"),
    "PUBLISH": ("topic", "payload", "qos", "packet_id", "retain", "properties"),
    "PUBACK": ("packet_id", "reason_code", "properties"),
    "SUBACK": ("packet_id", "reason_codes", "properties"),
    "PINGRESP": (),
    "DISCONNECT": ("reason_code", "properties"),
}
FIRMWARE_ENCODES = ("CONNECT", "PUBLISH", "SUBSCRIBE", "PUBACK", "PINGREQ", "DISCONNECT")
PACKET_TYPES = {"CONNACK": 2, "PUBLISH": 3, "PUBACK": 4, "SUBACK": 9, "PINGRESP": 13, "DISCONNECT": 14}


def received_by_firmware(vector: dict[str, Any]) -> bool:
    """An MQTT 5 vector of a packet type the firmware receives (or an incomplete one: that is the framer's)."""
    if vector["version"] != 5:
        return False
    if vector.get("incomplete"):
        return True
    return canonical.wire(vector)[0] >> 4 in PACKET_TYPES.values()


MQTT_DECODE = [v for v in MQTT["vectors"] if received_by_firmware(v)]
MQTT_ENCODE = [v for v in MQTT["vectors"] if v["version"] == 5 and "packet" in v and v.get("encode", True)
               and v["packet"]["type"] in FIRMWARE_ENCODES]
RESP3_ENCODE = [v for v in RESP3["vectors"] if "command" in v]
HLC_FORMAT = [v for v in HLC["vectors"] if "hlc" in v and v.get("encode", True)]


def with_property_ids(pairs: list[list[Any]]) -> list[list[Any]]:
    return [[PROPERTY_IDS[name], value] for name, value in pairs]


def job() -> dict[str, list[dict[str, Any]]]:
    """Every case, in the form the runner reads: bytes as hex, properties by id, defaults filled in."""
    encode = []
    for vector in MQTT_ENCODE:
        packet = canonical.expected_packet(vector, wire_order=True)
        packet["properties"] = with_property_ids(packet.get("properties", []))
        encode.append({"id": vector["id"], "packet": packet})
    return {
        "mqtt_decode": [{"id": v["id"], "hex": canonical.wire(v).hex()} for v in MQTT_DECODE],
        "mqtt_encode": encode,
        "resp3_decode": [{"id": v["id"], "hex": canonical.wire(v).hex()} for v in RESP3["vectors"]],
        "resp3_encode": [{"id": v["id"], "command": v["command"]} for v in RESP3_ENCODE],
        "hlc_parse": [{"id": v["id"], "text": v["text"]} for v in HLC["vectors"]],
        "hlc_format": [{"id": v["id"], "hlc": v["hlc"]} for v in HLC_FORMAT],
        "notify_topic": [{"id": v["id"], "client_id": v["client_id"], "key": v["key"]} for v in STATESTORE["notify_topics"]],
        "notification": [{"id": v["id"], "topic": v["topic"], "payload_hex": canonical.wire(v, "payload").hex()}
                         for v in STATESTORE["notifications"]],
        "response_topic": [{"id": v["id"], "client_id": v["client_id"]} for v in STATESTORE["response_topics"]],
    }


@pytest.fixture(scope="module")
def firmware(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    """(suite, vector id) -> what the firmware made of it, from one micropython run."""
    path = tmp_path_factory.mktemp("conformance") / "job.json"
    # Non-ASCII as UTF-8, not \u escapes: MicroPython's json reads an escaped surrogate pair as two code points.
    path.write_text(json.dumps(job(), ensure_ascii=False), encoding="utf-8")
    proc = subprocess.run([str(MICROPYTHON), str(RUNNER), str(path)], capture_output=True, text=True, errors="replace", timeout=60,
                          env={"MICROPYPATH": str(FIRMWARE)})
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines and lines[-1] == "DONE", proc.stdout[-2000:] + proc.stderr
    results = {}
    for line in lines[:-1]:
        record = json.loads(line)
        results[(record["suite"], record["id"])] = record["outcome"]
    return results


def outcome(firmware: dict[tuple[str, str], Any], suite: str, vector: dict[str, Any]) -> Any:
    result = firmware[(suite, vector["id"])]
    assert "crash" not in result, f"the firmware failed in an unforeseen way: {result['crash']}"
    return result


# --- MQTT ----------------------------------------------------------------------------------------------


def firmware_view(packet: dict[str, Any]) -> dict[str, Any]:
    """The canonical packet restricted to the fields the firmware's decoder of its type reports."""
    return {"type": packet["type"]} | {field: packet[field] for field in FIRMWARE_DECODES[packet["type"]]}


@pytest.mark.parametrize("vector", params(MQTT_DECODE))
def test_mqtt_decode(firmware: dict[tuple[str, str], Any], vector: dict[str, Any]) -> None:
    result = outcome(firmware, "mqtt_decode", vector)
    if "packet" in result:
        packet = result["packet"]
        if "properties" in packet:
            names = [[PROPERTY_NAMES[ident], value] for ident, value in packet["properties"]]
            packet["properties"] = canonical.canonical_properties(names)
        result = {"packet": packet}
    if "error" in vector:
        expected: Any = {"error": getattr(reasons, vector["error"].upper())}
    elif vector.get("incomplete"):
        expected = {"incomplete": True}
    else:
        expected = {"packet": firmware_view(canonical.expected_packet(vector))}
    check(vector, "firmware", result, expected)


@pytest.mark.parametrize("vector", params(MQTT_ENCODE))
def test_mqtt_encode(firmware: dict[tuple[str, str], Any], vector: dict[str, Any]) -> None:
    result = outcome(firmware, "mqtt_encode", vector)
    if "skip" in result:
        pytest.skip(result["skip"])
    assert bytes.fromhex(result["hex"]).hex(" ") == canonical.wire(vector).hex(" ")


def test_the_firmware_meets_every_packet_type_it_handles() -> None:
    """The selection above is not empty by accident: each type the firmware decodes has valid and invalid
    vectors, and each type it sends has at least one vector it encodes."""
    decoded = {canonical.wire(v)[0] >> 4 for v in MQTT_DECODE if "packet" in v}
    rejected = {canonical.wire(v)[0] >> 4 for v in MQTT_DECODE if "error" in v}
    assert decoded == rejected == set(PACKET_TYPES.values())
    assert {v["packet"]["type"] for v in MQTT_ENCODE} == set(FIRMWARE_ENCODES)


# --- RESP3 ---------------------------------------------------------------------------------------------


def without_err_prefix(value: Any) -> Any:
    """The firmware reports an error reply by its text, the ``ERR `` or ``ERR: `` prefix stripped (docs/firmware.md)."""
    if isinstance(value, list):
        return [without_err_prefix(item) for item in value]
    if isinstance(value, dict) and "error" in value:
        text = value["error"]
        for prefix in ("ERR: ", "ERR "):
            if text.startswith(prefix):
                return {"error": text[len(prefix) :]}
    return value


@pytest.mark.parametrize("vector", params(RESP3["vectors"]))
def test_resp3_decode(firmware: dict[tuple[str, str], Any], vector: dict[str, Any]) -> None:
    expected = {"error": True} if vector.get("error") else {"value": without_err_prefix(canonical.resp3_value(vector))}
    check(vector, "firmware", outcome(firmware, "resp3_decode", vector), expected)


@pytest.mark.parametrize("vector", params(RESP3_ENCODE))
def test_resp3_encode(firmware: dict[tuple[str, str], Any], vector: dict[str, Any]) -> None:
    assert bytes.fromhex(outcome(firmware, "resp3_encode", vector)["hex"]) == canonical.wire(vector)


# --- HLC -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", params(HLC["vectors"]))
def test_hlc_parse(firmware: dict[tuple[str, str], Any], vector: dict[str, Any]) -> None:
    expected = {"error": True} if vector.get("error") else {"hlc": vector["hlc"]}
    check(vector, "firmware", outcome(firmware, "hlc_parse", vector), expected)


@pytest.mark.parametrize("vector", params(HLC_FORMAT))
def test_hlc_format(firmware: dict[tuple[str, str], Any], vector: dict[str, Any]) -> None:
    assert outcome(firmware, "hlc_format", vector) == {"text": vector["text"]}


# --- State store topics and notifications ---------------------------------------------------------------


@pytest.mark.parametrize("vector", params(STATESTORE["notify_topics"]))
def test_notify_topic(firmware: dict[tuple[str, str], Any], vector: dict[str, Any]) -> None:
    assert outcome(firmware, "notify_topic", vector) == {"topic": vector["topic"]}


@pytest.mark.parametrize("vector", params(STATESTORE["notifications"]))
def test_notification(firmware: dict[tuple[str, str], Any], vector: dict[str, Any]) -> None:
    expected: Any = {"error": True}
    if "notification" in vector:
        note = vector["notification"]
        expected = {"key": hexed(as_bytes(note["key"])), "operation": note["operation"], "value": note["value"]}
    check(vector, "firmware", outcome(firmware, "notification", vector), expected)


@pytest.mark.parametrize("vector", params(STATESTORE["response_topics"]))
def test_response_topic(firmware: dict[tuple[str, str], Any], vector: dict[str, Any]) -> None:
    assert outcome(firmware, "response_topic", vector) == {"topic": vector["topic"]}
