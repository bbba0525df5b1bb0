"""What a device may hand the gateway for forwarding (appliance/forwarding/validity.py), property-based.

The property that matters: whatever the ingress check lets through, substituted into any topic template
and sent as user properties, is a PUBLISH a conforming MQTT 5 server takes - paho encodes it, and the
upstream check finds nothing to refuse. Whatever it refuses has a reason and the reason code 0x90 (from
the topic) or 0x99 (from the PUBLISH's properties).
"""

from __future__ import annotations

import re
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.forwarding.config import TOPIC_FIELDS
from appliance.forwarding.messages import message_from_publish
from appliance.forwarding.validity import (
    MAX_LEVEL_CHARS,
    InvalidMessage,
    check_publish_properties,
    check_topic_values,
    publish_size,
    upstream_problem,
)
from testing.campaigns import campaign

TEMPLATE = "gateways/{gateway_id}/devices/{device_id}/modules/{module_id}/outputs/{output}/{message_id}/{priority}"
#: Characters a hostile device reaches for: wildcards, separators, controls, non-characters, bag syntax.
NASTY = st.sampled_from(["+", "#", "/", "\x00", "\t", "\n", "\x7f", "\x85", "\ufffe", "\uffff", "\ufdd0",
                         "\U0001fffe", "=", "&", "%", "$", "é", "a", "Z", "0", " "])
VALUES = st.text(alphabet=st.one_of(NASTY, st.characters(blacklist_categories=("Cs",))), max_size=40)
FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\ufdd0-\ufdef\ufffe\uffff]")


def paho_publish_bytes(topic: str, payload: bytes, properties: Properties | None, protocol: int = mqtt.MQTTv5) -> bytes:
    """The PUBLISH paho itself would write (its encoder, no socket)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=protocol)
    captured: list[bytes] = []

    def queue(command: int, packet: bytearray, mid: int, qos: int, info: Any = None) -> Any:
        captured.append(bytes(packet))
        return mqtt.MQTT_ERR_SUCCESS

    client._packet_queue = queue  # type: ignore[method-assign]
    client._sock = object()  # type: ignore[assignment]  # "connected": publish() encodes instead of queueing
    try:
        client.publish(topic, payload, qos=1, properties=properties)
    finally:
        client._sock = None
    return captured[0]


@campaign(300, deadline=None)
@given(device=VALUES, module=VALUES, output=VALUES,
       bag=st.lists(st.tuples(VALUES, VALUES), max_size=4))
def test_what_ingress_accepts_any_server_accepts(device: str, module: str, output: str,
                                                 bag: list[tuple[str, str]]) -> None:
    try:
        check_topic_values(device, module, output, bag)
    except InvalidMessage as refused:
        assert refused.reason_code == 0x90 and refused.reason and refused.detail
        return
    topic = TEMPLATE.format(gateway_id="gw1", device_id=device, module_id=module, output=output,
                            message_id="gw1:1", priority=0)
    assert topic.count("/") == TEMPLATE.count("/"), "a value added or removed a topic level"
    assert not FORBIDDEN.search(topic) and "+" not in topic and "#" not in topic
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = bag
    packet = paho_publish_bytes(topic, b"x", properties)  # paho raises on what it will not encode
    assert upstream_problem(topic, bag, None, len(packet), None) is None
    assert all(len(level) <= MAX_LEVEL_CHARS for level in (device, module, output))


@campaign(200, deadline=None)
@given(properties=st.lists(st.tuples(VALUES, VALUES), max_size=4), content_type=st.none() | VALUES)
def test_mqtt5_properties_are_refused_with_0x99_or_forwardable(properties: list[tuple[str, str]],
                                                               content_type: str | None) -> None:
    try:
        check_publish_properties(properties, content_type)
    except InvalidMessage as refused:
        assert refused.reason_code == 0x99 and refused.reason
        return
    assert all(name and not FORBIDDEN.search(name + value) for name, value in properties)
    assert content_type is None or not FORBIDDEN.search(content_type)


@campaign(200, deadline=None)
@given(topic=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="+#\x00"),
                     min_size=1, max_size=60),
       payload=st.binary(max_size=300),
       properties=st.lists(st.tuples(st.text(min_size=1, max_size=30), st.text(max_size=200)), max_size=5),
       v5=st.booleans())
def test_the_size_check_is_the_size_paho_writes(topic: str, payload: bytes, properties: list[tuple[str, str]],
                                                v5: bool) -> None:
    packed = None
    props = None
    if v5:
        props = Properties(PacketTypes.PUBLISH)
        if properties:
            props.UserProperty = properties
        packed = props.pack()
    written = paho_publish_bytes(topic, payload, props, mqtt.MQTTv5 if v5 else mqtt.MQTTv311)
    assert publish_size(topic, len(payload), packed) == len(written)


@pytest.mark.parametrize(("topic", "reason"), [
    ("devices/d1/modules/m/messages/events/$.on=%23", "wildcard"),  # the pump killer
    ("devices/d1/modules/m/messages/events/%24.on=a%2Bb", "wildcard"),
    ("devices/d1/modules/m/messages/events/%24.on=a%2Fb", "level_separator"),
    ("devices/d1/messages/events/note=line1%0Aline2", "control_character"),  # the poison message
    ("devices/d\t1/messages/events/a=1", "control_character"),  # a tab in a device id
    ("devices/d1/messages/events/a=%00", "control_character"),
    ("devices/d1/messages/events/a=%EF%BF%BE", "bad_unicode"),  # U+FFFE
    ("devices/d1/messages/events/" + "o" * (MAX_LEVEL_CHARS + 1), "too_long"),
    ("devices/" + "d" * (MAX_LEVEL_CHARS + 1) + "/messages/events", "too_long"),
    ("devices/d1/modules/m/messages/events/%24.on=", "empty_level"),
    ("devices/d1/messages/events/a=%FF%FE", "bag_not_utf8"),
    ("devices/d1/messages/events/=v", "empty_property_name"),
])
def test_device_values_that_cannot_go_upstream_are_refused_at_ingress(topic: str, reason: str) -> None:
    with pytest.raises(InvalidMessage) as refused:
        message_from_publish(topic, b"{}", [], None)
    assert (refused.value.reason, refused.value.reason_code) == (reason, 0x90)


def test_a_user_property_with_a_line_feed_is_refused_with_0x99() -> None:
    with pytest.raises(InvalidMessage) as refused:
        message_from_publish("devices/d1/messages/events/data", b"{}", [("note", "line1\nline2")], None)
    assert (refused.value.reason, refused.value.reason_code) == ("control_character", 0x99)


def test_values_at_the_limits_pass() -> None:
    message = message_from_publish("devices/" + "d" * MAX_LEVEL_CHARS + "/messages/events/a=%C3%A9&b=",
                                   b"{}", [("k", "v" * 1000)], "application/json")
    assert message is not None and message.properties[:2] == [("a", "é"), ("b", "")]


def test_every_topic_field_the_template_may_use_is_checked() -> None:
    """The device-controlled fields of ``topic_template``: device id, module id, output."""
    assert {"device_id", "module_id", "output"} <= set(TOPIC_FIELDS)
    for field in ("device id", "module id", "output name"):
        values = {"device_id": "d", "module_id": "m", "output": "o"}
        values[{"device id": "device_id", "module id": "module_id", "output name": "output"}[field]] = "a#b"
        with pytest.raises(InvalidMessage, match=field):
            check_topic_values(values["device_id"], values["module_id"], values["output"], [])


def test_the_upstream_check_names_a_packet_above_the_servers_maximum() -> None:
    problem = upstream_problem("t", [], None, 2000, 1024)
    assert problem is not None and problem.reason == "packet_too_large" and "1024" in problem.detail
    assert upstream_problem("t", [], None, 1024, 1024) is None
