"""Telemetry topics and IoT Hub property bags (appliance/forwarding/topics.py, messages.py).

The first cases follow Edge Hub's own converter tests (ProtocolGatewayMessageConverterTest: a device
with ``$.cid``/``$.mid`` and three application properties, the module form, every system property) and
IoT Hub's MQTT rules; then this gateway's forms, the precedence between the bag and MQTT 5 user
properties, and hostile input.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.forwarding.conditions import compile_condition
from appliance.forwarding.endpoints import identity_properties
from appliance.forwarding.messages import message_from_publish
from appliance.forwarding.queues import QueuedMessage
from appliance.forwarding.topics import (
    BAG_CASE_DUPLICATE,
    BAG_EMPTY_NAME,
    BAG_NOT_UTF8,
    BAG_TWO_OUTPUTS,
    PropertyBagError,
    parse_property_bag,
    parse_telemetry_topic,
)
from appliance.forwarding.validity import InvalidMessage


def test_device_bag_splits_system_and_application_properties() -> None:
    topic = "devices/Device_6/messages/events/%24.cid=Corrid1&%24.mid=MessageId1&Foo=Bar&Prop2=Value2&Prop3=Value3/"
    parsed = parse_telemetry_topic(topic)
    assert parsed is not None
    assert (parsed.device_id, parsed.module_id, parsed.output, parsed.source) == ("Device_6", None, None, "/messages/events")
    assert parsed.system == {"correlationId": "Corrid1", "messageId": "MessageId1"}
    assert parsed.application == [("Foo", "Bar"), ("Prop2", "Value2"), ("Prop3", "Value3")]


def test_module_form_takes_the_output_name_from_the_bag() -> None:
    topic = "devices/Device_6/modules/SensorModule/messages/events/%24.on=alerts&%24.cid=Corrid1&Foo=Bar"
    parsed = parse_telemetry_topic(topic)
    assert parsed is not None
    assert (parsed.device_id, parsed.module_id, parsed.output) == ("Device_6", "SensorModule", "alerts")
    assert parsed.source == "/messages/modules/SensorModule/outputs/alerts"
    assert parsed.system == {"correlationId": "Corrid1"} and parsed.application == [("Foo", "Bar")]


def test_module_without_a_bag() -> None:
    for topic in ("devices/d/modules/m/messages/events", "devices/d/modules/m/messages/events/"):
        parsed = parse_telemetry_topic(topic)
        assert parsed is not None and parsed.module_id == "m" and parsed.source == "/messages/modules/m"


def test_every_system_property_of_the_wire_map() -> None:
    bag = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in [
        ("$.cid", "1234"), ("$.mid", "mid1"), ("$.to", "d2"), ("$.uid", "u1"), ("$.on", "op1"), ("$.ct", "application/json"),
        ("$.ce", "utf-8"), ("$.schema", "someschema"), ("$.ctime", "2018-01-31"), ("$.exp", "2030-01-01T00:00:00Z"),
    ]) + "&Foo=Bar&Prop2=Value2&Prop3=Value3"
    message = message_from_publish(f"devices/Device_6/messages/events/{bag}", b"{}", [], None)
    assert message is not None
    assert (message.output, message.content_type, message.content_encoding, message.message_id) == (
        "op1", "application/json", "utf-8", "mid1"
    )
    assert message.system == {"correlationId": "1234", "to": "d2", "userId": "u1", "messageSchema": "someschema",
                              "creationTime": "2018-01-31", "absolute-expiry-time": "2030-01-01T00:00:00Z"}
    assert message.properties == [("Foo", "Bar"), ("Prop2", "Value2"), ("Prop3", "Value3")]
    assert message.system_property("correlationId") == "1234" and message.system_property("outputName") == "op1"


@pytest.mark.parametrize("topic, output, application", [
    ("devices/t1/messages/events", None, []),
    ("devices/t1/messages/events/", None, []),
    ("devices/t1/messages/events/alerts", "alerts", []),  # this gateway's output segment (the firmware)
    ("devices/t1/messages/events/alerts/alert=true", "alerts", [("alert", "true")]),
    ("devices/t1/messages/events/alerts/alert=true/", "alerts", [("alert", "true")]),
    ("devices/t1/messages/events/alert=true", None, [("alert", "true")]),
    ("devices/t1/messages/events/note=a%2Fb%20c+d&empty=&flag", None, [("note", "a/b c+d"), ("empty", ""), ("flag", "")]),
    ("devices/t1/messages/events/a=1&&b=2&", None, [("a", "1"), ("b", "2")]),
])
def test_topic_forms(topic: str, output: str | None, application: list[tuple[str, str]]) -> None:
    parsed = parse_telemetry_topic(topic)
    assert parsed is not None and parsed.device_id == "t1"
    assert (parsed.output, parsed.application) == (output, application)


@pytest.mark.parametrize("topic", [
    "devices/t1/messages/devicebound",
    "devices/t1/messages/events/a/b",  # two plain segments: neither an output nor a bag
    "devices//messages/events",
    "devices/gw/modules/m/inputs/i",  # what the gateway itself delivers to modules
])
def test_not_telemetry(topic: str) -> None:
    assert parse_telemetry_topic(topic) is None
    assert message_from_publish(topic, b"", [], None) is None


@pytest.mark.parametrize(("topic", "reason"), [
    ("devices/t1/messages/events/Alert=true&alert=false", BAG_CASE_DUPLICATE),
    ("devices/t1/modules/m/messages/events/%24.on=o&ZONE=1&zone=2", BAG_CASE_DUPLICATE),
    ("devices/t1/messages/events/=1", BAG_EMPTY_NAME),
    ("devices/t1/messages/events/alerts/%24.on=data", BAG_TWO_OUTPUTS),
    ("devices/t1/messages/events/a=%ff", BAG_NOT_UTF8),
    ("devices/t1/messages/events/%fe=1", BAG_NOT_UTF8),
])
def test_refused_bags_say_why(topic: str, reason: str) -> None:
    """Edge Hub fails such a publish (a case-insensitive dictionary cannot hold ``Alert`` and ``alert``);
    routing on whichever copy came first would pick the route by position."""
    with pytest.raises(PropertyBagError) as info:
        parse_telemetry_topic(topic)
    assert info.value.reason == reason
    with pytest.raises(PropertyBagError):
        message_from_publish(topic, b"", [], None)


def test_a_repeated_key_keeps_its_last_value_in_its_first_place() -> None:
    """As Edge Hub's URL decoder, which assigns each pair into a dictionary."""
    assert parse_property_bag("a=1&b=2&a=3") == [("a", "3"), ("b", "2")]
    message = message_from_publish("devices/t1/messages/events/alert=false&alert=true", b"", [], None)
    assert message is not None and message.app_property("alert") == "true"


@pytest.mark.parametrize(("topic", "reason"), [
    ("devices/t1/messages/events/=1", "empty_property_name"),
    ("devices/t1/messages/events/=v", "empty_property_name"),
    ("devices/t1/messages/events/alerts/%24.on=data", "output_conflict"),
    ("devices/t1/messages/events/a=%ff", "bag_not_utf8"),
    ("devices/t1/messages/events/a=%FF%FE", "bag_not_utf8"),
    ("devices/t1/messages/events/Alert=true&alert=false", "property_in_two_cases"),
])
def test_telemetry_whose_bag_does_not_decode_is_refused_with_its_reason(topic: str, reason: str) -> None:
    """Once silently not routed (PUBACK 0, no log, no counter): now refused with 0x90 and a reason."""
    with pytest.raises(InvalidMessage) as refused:
        message_from_publish(topic, b"", [], None)
    assert (refused.value.reason, refused.value.reason_code) == (reason, 0x90)


@pytest.mark.parametrize(("topic", "user_properties"), [
    ("devices/t1/messages/events/gw-message-id=gw1%3A1&n=1", []),
    ("devices/t1/messages/events/GW-Device-Id=t2&n=1", []),
    ("devices/t1/messages/events/", [("gw-device-id", "t2"), ("n", "1")]),
    ("devices/t1/modules/m/messages/events/", [("gw-message-id", "gw1:1"), ("gw-priority", "0"), ("n", "1")]),
])
def test_a_property_in_the_gateways_own_namespace_is_not_the_devices(topic: str,
                                                                     user_properties: list[tuple[str, str]]) -> None:
    """The ``gw-*`` user properties are the gateway's (docs/message-format.md): a device's own, forwarded
    after them, came out last, and the cloud ingest (pipeline/envelope.py) keeps the last value of a name.
    Before: a device sending ``gw-message-id=gw1:1`` made its message a "duplicate" of another (deduplicated
    away, lost) and ``gw-device-id`` passed it off as another device. A module re-sending its input (which
    carries the first hop's ``gw-*``) must still be forwarded, so they are dropped, not refused."""
    message = message_from_publish(topic, b"", user_properties, None)
    assert message is not None and message.properties == [("n", "1")]
    item = QueuedMessage(seq=7, endpoint="upstream", priority=2, enqueued_ms=1, ttl_s=60, expires_ms=60001, message=message)
    sent = identity_properties(item, "gw1", 2)
    assert [value for name, value in sent if name.lower() == "gw-message-id"] == ["gw1:7"]
    assert [value for name, value in sent if name.lower() == "gw-device-id"] == ["t1"]


def test_property_bag_errors_name_the_problem() -> None:
    with pytest.raises(PropertyBagError, match="empty property name"):
        parse_property_bag("=x")


def test_interface_id_and_component_are_system_properties() -> None:
    """``$.ifid`` and ``$.sub`` (IoT Plug and Play) are in Edge Hub's IncomingSystemPropertiesMap."""
    parsed = parse_telemetry_topic("devices/t1/messages/events/%24.ifid=urn%3Aa%3Ab%3B1&%24.sub=thermostat1&x=1")
    assert parsed is not None
    assert parsed.system == {"iothub-interface-id": "urn:a:b;1", "dt-subject": "thermostat1"}
    assert parsed.application == [("x", "1")]


def test_the_bag_wins_over_a_user_property_of_the_same_name() -> None:
    """Documented precedence: one value per name, the topic's."""
    message = message_from_publish(
        "devices/t1/messages/events/Alert=true&%24.ct=text%2Fplain&%24.mid=bag-id",
        b"x", [("alert", "false"), ("zone", "3"), ("message-id", "user-id")], "application/json",
    )
    assert message is not None
    assert message.properties == [("Alert", "true"), ("zone", "3")]
    assert (message.content_type, message.message_id) == ("text/plain", "bag-id")


def test_user_properties_alone_still_route() -> None:
    message = message_from_publish("devices/t1/messages/events/alerts", b"x", [("alert", "true")], None)
    assert message is not None and message.app_property("alert") == "true" and message.output == "alerts"


def test_a_where_clause_sees_bag_properties() -> None:
    condition = compile_condition("alert = 'true' AND $correlationId = 'c1'")
    message = message_from_publish("devices/t1/messages/events/alert=true&%24.cid=c1", b"", [], None)
    assert message is not None and condition.matches(message)


@given(st.lists(st.tuples(st.text(min_size=1), st.text()), unique_by=lambda kv: kv[0].lower(), max_size=8))
def test_any_encoded_bag_decodes_to_what_was_encoded(pairs: list[tuple[str, str]]) -> None:
    bag = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)
    assert parse_property_bag(bag) == pairs


@given(st.text(alphabet=st.sampled_from("devicesmoduls/=&%$.+24abcfF0"), max_size=80))
def test_hostile_topics_parse_or_are_refused(topic: str) -> None:
    try:
        parsed = parse_telemetry_topic(topic)
    except InvalidMessage as refused:
        assert refused.reason and refused.reason_code == 0x90
        return
    if parsed is not None:
        assert parsed.device_id and "/" not in parsed.device_id
        assert all(key for key, _ in parsed.application)
