"""What devices and deployments written for Edge Hub expect, held against Azure/iotedge's own code.

``FROM`` compares whole path segments (``BaseMessageSource.Match``), a bag naming one property in two
cases is refused and a repeated key keeps its last value (``EdgeMessage``, the protocol gateway's URL
decoder), schemaVersion 1.0-1.3 load (``EdgeHubConfigParser``), Edge Hub's usual device routes work, and
the message format forwards the device's ``$.mid``, ``$.cid`` and ``$.ce``. The unit cases run on the
route evaluator; the last runs the real gateway with paho devices and mosquitto as the cloud.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from appliance.broker.codec.reasons import TOPIC_NAME_INVALID
from appliance.forwarding.endpoints import identity_properties
from appliance.forwarding.manifest import parse_manifest
from appliance.forwarding.messages import message_from_publish
from appliance.forwarding.queues import QueuedMessage
from testing import paho_clients
from tests.forwarding.rig import ForwardingRig

#: The routes of Azure/iotedge's sample deployments and docs, as a deployment file carries them (1.2).
EDGE_HUB_DEPLOYMENT = {
    "modulesContent": {
        "$edgeAgent": {"properties.desired": {"schemaVersion": "1.1", "modules": {}}},
        "$edgeHub": {"properties.desired": {
            "schemaVersion": "1.2",
            "routes": {
                "devices": "FROM /messages/* WHERE NOT IS_DEFINED($connectionModuleId) INTO $upstream",
                "sensor": {"route": "FROM /messages/modules/sens/* INTO $upstream", "priority": 1},
                "filtered": "FROM /messages/modules/filter/outputs/o1 INTO $upstream",
            },
            "storeAndForwardConfiguration": {"timeToLiveSecs": 7200},
            "mqttBroker": {"authorizations": []},
        }},
    }
}


def routed(topic: str) -> list[str]:
    message = message_from_publish(topic, b"{}", [], None)
    assert message is not None
    evaluator = parse_manifest(EDGE_HUB_DEPLOYMENT).evaluator()
    return sorted(f"{r.endpoint.id}:{r.priority}" for r in evaluator.evaluate(message))


@pytest.mark.parametrize(("topic", "endpoints"), [
    ("devices/d1/messages/events/", ["upstream:10"]),
    ("devices/d1/messages/events/alerts/alert=true", ["upstream:10"]),
    # A module without $.on: source /messages/modules/sens, taken by "sens/*".
    ("devices/d1/modules/sens/messages/events/", ["upstream:1"]),
    ("devices/d1/modules/sens/messages/events/%24.on=temp", ["upstream:1"]),
    # Whole segments: neither sens10 nor output o10 is taken by a route naming sens or o1.
    ("devices/d1/modules/sens10/messages/events/%24.on=temp", []),
    ("devices/d1/modules/filter/messages/events/%24.on=o1", ["upstream:10"]),
    ("devices/d1/modules/filter/messages/events/%24.on=o10", []),
    ("devices/d1/modules/filter/outputs/o10", []),
])
def test_edge_hub_sample_routes(topic: str, endpoints: list[str]) -> None:
    assert routed(topic) == endpoints


def test_from_messages_events_takes_device_messages_only() -> None:
    """Here device telemetry has the source /messages/events (Edge Hub's is /messages, which no route
    FROM /messages/events takes there): docs/forwarding.md."""
    evaluator = parse_manifest({"schemaVersion": "1.2", "routes": {"r": "FROM /messages/events INTO $upstream"}}).evaluator()
    device = message_from_publish("devices/d1/messages/events/a=1", b"", [], None)
    module = message_from_publish("devices/d1/modules/events/messages/events/%24.on=o", b"", [], None)
    assert device is not None and module is not None
    assert len(evaluator.evaluate(device)) == 1 and evaluator.evaluate(module) == []


def test_the_message_format_forwards_message_id_correlation_id_and_content_encoding() -> None:
    message = message_from_publish("devices/d1/messages/events/%24.mid=m-1&%24.cid=c-1&%24.ce=utf-8&n=1", b"{}", [], None)
    assert message is not None
    properties = identity_properties(QueuedMessage(7, "upstream", 2, 1000, 60, 61_000, message), "gw1", 2000)
    assert properties[-4:] == [("n", "1"), ("content-encoding", "utf-8"), ("message-id", "m-1"), ("correlation-id", "c-1")]
    plain = message_from_publish("devices/d1/messages/events/n=1", b"{}", [], None)
    assert plain is not None
    assert identity_properties(QueuedMessage(7, "upstream", 2, 1000, 60, 61_000, plain), "gw1", 2000)[-1] == ("n", "1")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[ForwardingRig]:
    deployment = tmp_path / "deployment.json"
    rig = ForwardingRig(tmp_path, {"placeholder": "FROM /messages/* WHERE false INTO $upstream"})
    try:
        deployment.write_text(json.dumps(EDGE_HUB_DEPLOYMENT))
        rig.manifest_path.write_text(deployment.read_text())
        rig.wait_for_log_count(r"routes loaded from .*: 3 routes", 1)
        yield rig
    finally:
        rig.close()


def test_a_gateway_running_an_edge_hub_deployment(rig: ForwardingRig) -> None:
    device = rig.device("d1")
    # Refused with a reason code, as Edge Hub fails the publish: nothing reaches the cloud.
    assert device.publish("Alert=true&alert=false&n=1", b"{}") == TOPIC_NAME_INVALID
    # A repeated key keeps its last value; the device's $.mid, $.cid and $.ce go upstream.
    assert device.publish("n=0&n=2&%24.mid=m-2&%24.cid=c-2&%24.ce=utf-8", b"{}") == 0
    module = device.client.publish("devices/d1/modules/sens/messages/events/n=3", b"{}", qos=1)
    assert device.wait_ack(module.mid) == 0
    other = device.client.publish("devices/d1/modules/sens10/messages/events/n=4", b"{}", qos=1)
    assert device.wait_ack(other.mid) == 0
    # A last device message: had n=4 been routed (either priority), it would arrive before this one.
    assert device.publish("n=5", b"{}") == 0
    received = rig.cloud.wait_for(3)
    by_n = {m.n: m for m in received}
    assert sorted(by_n) == [2, 3, 5]
    assert {k: by_n[2].user_properties[k] for k in ("message-id", "correlation-id", "content-encoding")} == {
        "message-id": "m-2", "correlation-id": "c-2", "content-encoding": "utf-8"}
    assert by_n[3].user_properties["gw-priority"] == "1" and by_n[3].user_properties["gw-module-id"] == "sens"
    assert "refused a message from d1" in rig.gateway.output() and "property_in_two_cases" in rig.gateway.output()


def test_a_3_1_1_device_gets_its_puback_and_the_refused_bag_goes_nowhere(rig: ForwardingRig) -> None:
    """MQTT 3.1.1 has no negative PUBACK: the refusal is the log line (and nothing stored or forwarded)."""
    acked = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="old1", protocol=mqtt.MQTTv311)
    client.on_publish = lambda *args: acked.set()
    client.connect(rig.gateway.host, rig.gateway.port)
    client.loop_start()
    try:
        client.publish("devices/old1/messages/events/Zone=a&zone=b&n=1", b"{}", qos=1)
        assert acked.wait(10)
        acked.clear()
        client.publish("devices/old1/messages/events/n=2", b"{}", qos=1)
        assert acked.wait(10)
        [received] = rig.cloud.wait_for(1)
        assert received.n == 2 and received.user_properties["gw-device-id"] == "old1"
        rig.wait_for_log_count(r"refused a message from old1 .*property_in_two_cases.*'Zone' given twice, also as 'zone'", 1)
    finally:
        paho_clients.close(client)
