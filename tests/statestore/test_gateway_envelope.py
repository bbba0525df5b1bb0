"""The MQTT envelope of a request: MQTT 5, QoS 1, Response Topic, Correlation Data, allowed topics."""

from __future__ import annotations

import time
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest

from appliance.statestore.client import StateStoreClient, StatusError
from appliance.statestore.commands import GetCommand, SetCommand
from appliance.statestore.hlc import Hlc
from appliance.statestore.protocol import REQUEST_TOPIC
from appliance.statestore.resp3 import encode_array
from testing.processes import GatewayProcess
from tests.statestore.raw_mqtt import TIMEOUT, RawClient

REQUEST = GetCommand(b"envelope-key").encode()


@pytest.fixture
def raw(gateway: GatewayProcess) -> Iterator[RawClient]:
    client = RawClient(gateway.host, gateway.port)
    client.subscribe(f"clients/{client.client_id}/resp")
    client.subscribe(f"clients/{client.client_id}/marker")
    yield client
    client.close()


def marker_then_next(raw: RawClient) -> bytes:
    """Publish a marker to ourselves; return the payload of the next message we receive."""
    raw.publish(f"clients/{raw.client_id}/marker", b"marker")
    return raw.next_message().payload


def test_a_valid_request_is_answered_with_correlation_data(raw: RawClient) -> None:
    raw.publish(REQUEST_TOPIC, REQUEST, response_topic=f"clients/{raw.client_id}/resp", correlation_data=b"\x00\x01")
    reply = raw.next_message()
    assert reply.payload == b"$-1\r\n" and reply.qos == 1
    assert reply.properties.CorrelationData == b"\x00\x01"
    assert ("__stat", "200") in reply.properties.UserProperty


@pytest.mark.parametrize(
    ("response_topic", "correlation_data"), [(None, b"1"), ("RESPONSE", None)], ids=["no-response-topic", "no-correlation-data"]
)
def test_missing_properties_fail_the_puback(raw: RawClient, response_topic: str | None, correlation_data: bytes | None) -> None:
    topic = f"clients/{raw.client_id}/resp" if response_topic else None
    mid = raw.publish(REQUEST_TOPIC, REQUEST, response_topic=topic, correlation_data=correlation_data)
    acked_mid, reason = raw.pubacks.get(timeout=TIMEOUT)
    assert acked_mid == mid and reason >= 0x80
    assert marker_then_next(raw) == b"marker"  # no response came before the marker


def test_qos0_requests_get_no_response(raw: RawClient) -> None:
    raw.publish(REQUEST_TOPIC, REQUEST, qos=0, response_topic=f"clients/{raw.client_id}/resp", correlation_data=b"1")
    assert marker_then_next(raw) == b"marker"


@pytest.mark.parametrize(
    "response_topic",
    [REQUEST_TOPIC, "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E74/command/notify/4B",
     "clients/deputy/+", "#"],
)
def test_a_forbidden_response_topic_disconnects_the_client(raw: RawClient, response_topic: str) -> None:
    raw.publish(REQUEST_TOPIC, REQUEST, response_topic=response_topic, correlation_data=b"1")
    assert raw.disconnects.get(timeout=TIMEOUT) >= 0x80


def test_mqtt_311_requests_are_not_served_and_not_routed(gateway: GatewayProcess, raw: RawClient) -> None:
    raw.subscribe(REQUEST_TOPIC)  # an ordinary subscriber of the system topic
    old = RawClient(gateway.host, gateway.port, protocol=mqtt.MQTTv311)
    try:
        mid = old.publish(REQUEST_TOPIC, REQUEST)
        assert old.pubacks.get(timeout=TIMEOUT)[0] == mid  # 3.1.1 has no way to say no: a plain PUBACK
        assert marker_then_next(raw) == b"marker"
        assert old.disconnects.empty()
    finally:
        old.close()


def test_served_requests_are_not_routed_to_ordinary_subscribers(raw: RawClient) -> None:
    raw.subscribe(REQUEST_TOPIC)
    raw.publish(REQUEST_TOPIC, REQUEST, response_topic=f"clients/{raw.client_id}/resp", correlation_data=b"1")
    assert raw.next_message().payload == b"$-1\r\n"
    assert marker_then_next(raw) == b"marker"


def versioned_request(raw: RawClient, payload: bytes, version: str) -> dict[str, str]:
    raw.publish(REQUEST_TOPIC, payload, response_topic=f"clients/{raw.client_id}/resp", correlation_data=b"v",
                user_properties=[("__protVer", version), ("__ts", str(Hlc(time.time_ns() // 1_000_000, 0, "raw")))])
    reply = raw.next_message()
    assert reply.properties.CorrelationData == b"v"
    return {"payload": reply.payload.decode(), **dict(reply.properties.UserProperty)}


@pytest.mark.parametrize("version", ["2.0", "0.9", "1", "1.0.1", "one.zero"])
def test_an_unsupported_protocol_version_gets_505_and_is_not_executed(raw: RawClient, version: str) -> None:
    key = f"protver-{version}".encode()
    reply = versioned_request(raw, SetCommand(key, b"v").encode(), version)
    assert reply == {
        "payload": "", "__stat": "505", "__stMsg": f"unsupported protocol version {version!r}",
        "__supProtMajVer": "1", "__requestProtVer": version, "__protVer": "1.0",
    }
    assert versioned_request(raw, GetCommand(key).encode(), "1.0")["payload"] == "$-1\r\n"


@pytest.mark.parametrize("version", ["1.7", ""])  # any 1.x; empty reads as absent (1.0), as in the Go executor
def test_any_1_x_protocol_version_is_served(raw: RawClient, version: str) -> None:
    reply = versioned_request(raw, SetCommand(b"protver-minor", b"v").encode(), version)
    assert (reply["payload"], reply["__stat"], reply["__protVer"]) == ("+OK\r\n", "200", "1.0")
    assert versioned_request(raw, encode_array([b"DEL", b"protver-minor"]), "1.0")["payload"] == ":1\r\n"


def test_the_client_raises_for_a_failure_status(client: StateStoreClient) -> None:
    with pytest.raises(StatusError) as rejected:
        client.request(GetCommand(b"k").encode(), [("__protVer", "2.0")])
    assert rejected.value.status == "505" and "2.0" in rejected.value.message
