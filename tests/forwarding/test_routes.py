"""Route parsing, source matching and the evaluator (priority/TTL cases ported from Edge Hub's EvaluatorTest)."""

from __future__ import annotations

import pytest

from appliance.forwarding.conditions import DictMessage
from appliance.forwarding.lexer import RouteSyntaxError
from appliance.forwarding.messages import message_from_publish
from appliance.forwarding.routes import (
    DEFAULT_PRIORITY,
    UPSTREAM,
    Evaluator,
    parse_route,
)

TELEMETRY = DictMessage({"key1": "value1", "key2": "value2"}, {}, source="/messages/events")
MESSAGE4 = DictMessage({"key1": "value4", "key2": "value2"}, {}, source="/messages/events")


def test_parse_route_with_condition_and_brokered_sink() -> None:
    route = parse_route(
        "r", 'FROM /messages/modules/cam/outputs/* WHERE key1 = "a" INTO BrokeredEndpoint("/modules/store/inputs/in1")', 3, 60
    )
    assert route.source == "/messages/modules/cam/outputs/*"
    assert route.endpoint.id == "modules/store/inputs/in1"
    assert (route.endpoint.module, route.endpoint.input) == ("store", "in1")
    assert (route.priority, route.ttl_s) == (3, 60)
    assert route.condition is not None and route.condition.text.strip() == 'key1 = "a"'


def test_select_star_legacy_form_and_upstream() -> None:
    route = parse_route("r", "SELECT * FROM /messages/* INTO $upstream")
    assert route.endpoint.id == UPSTREAM and route.condition is None and route.priority == DEFAULT_PRIORITY


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("FROM /messages/* WHERE key1 = INTO $upstream", 31),
        ("FROM /messages/* INTO $nowhere", 23),
        ("FROM messages INTO $upstream", 6),
        ("FROM /messages/* WHERE 3 + key1 > 1 INTO $upstream", 26),
        ("/messages/* INTO $upstream", 1),
        ('FROM /messages/* INTO BrokeredEndpoint("/modules/x")', 40),
    ],
)
def test_route_errors_point_at_the_column_of_the_whole_route(text: str, column: int) -> None:
    with pytest.raises(RouteSyntaxError) as info:
        parse_route("r", text)
    assert info.value.column == column, info.value


@pytest.mark.parametrize("target", ["/modules/a/inputs/#", "/modules/+/inputs/in", "/modules/a/inputs/i\\u0009n",
                                    "/modules/a\\u0000/inputs/in"])
def test_a_module_input_that_cannot_be_a_topic_is_refused(target: str) -> None:
    """The module and input become levels of the local topic ``devices/{gateway}/modules/{m}/inputs/{i}``.
    Before: a wildcard or control character was accepted (check-config passed) and every message routed
    there was published on a topic no client may publish to."""
    with pytest.raises(RouteSyntaxError) as info:
        parse_route("r", f'FROM /messages/* INTO BrokeredEndpoint("{target}")')
    assert info.value.column == 40, info.value


@pytest.mark.parametrize(
    ("source", "message_source", "matches"),
    [
        ("/messages/*", "/messages/events", True),
        ("/messages/*", "/messages/modules/m1/outputs/o1", True),
        ("/MESSAGES/Modules/M1/*", "/messages/modules/m1/outputs/o1", True),
        ("/messages/modules/m1/*", "/messages/modules/m2/outputs/o1", False),
        ("/messages/modules/m1/outputs/o1", "/messages/modules/m1/outputs/o1", True),
        ("/messages/modules/m1/outputs/o1", "/messages/modules/m1/outputs/o2", False),
        ("/twinChangeNotifications", "/messages/events", False),
        # Whole segments, as Edge Hub's BaseMessageSource.Match (a "/" appended to both sides):
        ("/messages/modules/m1/outputs/o1", "/messages/modules/m1/outputs/o10", False),
        ("/messages/modules/sender1", "/messages/modules/sender10/outputs/o1", False),
        ("/messages/modules/sender1", "/messages/modules/sender1/outputs/o1", True),
        ("/messages/modules/sender1/*", "/messages/modules/sender10", False),
        ("/messages/events", "/messages/eventsX", False),
        # A module message sent without $.on has the source /messages/modules/{m}: "{m}/*" takes it.
        ("/messages/modules/sens/*", "/messages/modules/sens", True),
        ("/messages/modules/sens/*", "/messages/modules/SENS/outputs/o", True),
        ("/messages/modules/sens/outputs/*", "/messages/modules/sens", False),
    ],
)
def test_from_matches_whole_segments_case_insensitively(source: str, message_source: str, matches: bool) -> None:
    assert parse_route("r", f"FROM {source} INTO $upstream").source_matches(message_source) is matches


def test_smoke_only_true_conditions_route() -> None:
    evaluator = Evaluator([parse_route("id1", "FROM /messages/* WHERE false INTO BrokeredEndpoint(\"/modules/a/inputs/i\")"),
                           parse_route("id2", "FROM /messages/* WHERE true INTO $upstream")])
    assert [r.endpoint.id for r in evaluator.evaluate(TELEMETRY)] == [UPSTREAM]


def test_no_fallback_unmatched_messages_go_nowhere() -> None:
    evaluator = Evaluator([parse_route("id1", "FROM /messages/* WHERE key1 = 'value1' INTO $upstream")])
    assert len(evaluator.evaluate(TELEMETRY)) == 1
    assert evaluator.evaluate(MESSAGE4) == []


def test_priorities_highest_wins_per_endpoint_with_its_ttl() -> None:
    """EvaluatorTest.TestPriorities: three routes to endpoint1 (P1/3600, P0/7200, P2/60), one to endpoint2."""
    sink1, sink2 = 'BrokeredEndpoint("/modules/e1/inputs/i")', 'BrokeredEndpoint("/modules/e2/inputs/i")'
    routes = [
        parse_route("id1", f"FROM /messages/* WHERE key1 = 'value1' INTO {sink1}", 1, 3600),
        parse_route("id2", f"FROM /messages/* WHERE key1 = 'value1' INTO {sink1}", 0, 7200),
        parse_route("id3", f"FROM /messages/* WHERE key1 = 'value1' INTO {sink1}", 2, 60),
        parse_route("id4", f"FROM /messages/* WHERE key1 = 'value1' INTO {sink2}", 0, 120),
    ]
    for ordering in (routes, routes[::-1]):
        results = {(r.endpoint.id, r.priority, r.ttl_s) for r in Evaluator(ordering).evaluate(TELEMETRY)}
        assert results == {("modules/e1/inputs/i", 0, 7200), ("modules/e2/inputs/i", 0, 120)}


def test_ttl_zero_inherits_the_global_ttl_and_default_priority_is_lowest() -> None:
    evaluator = Evaluator([parse_route("r", "FROM /messages/* INTO $upstream")], global_ttl_s=90)
    [result] = evaluator.evaluate(TELEMETRY)
    assert (result.priority, result.ttl_s) == (DEFAULT_PRIORITY, 90)
    assert DEFAULT_PRIORITY > 9


def test_topic_convention_selects_device_and_module_sources() -> None:
    alerts = message_from_publish("devices/t1/messages/events/alerts", b"{}", [("level", "high")], "application/json")
    module = message_from_publish("devices/gw/modules/cam/outputs/P0_Alerts", b"x", [("message-id", "m-1")], None)
    assert alerts is not None and module is not None
    assert (alerts.source, alerts.output, alerts.app_property("LEVEL")) == ("/messages/events", "alerts", "high")
    assert module.source == "/messages/modules/cam/outputs/P0_Alerts"
    assert module.system_property("connectionModuleId") == "cam" and module.system_property("messageId") == "m-1"
    evaluator = Evaluator([
        parse_route("alerts", "FROM /messages/* WHERE $outputName = 'alerts' AND level = 'high' INTO $upstream", 0),
        parse_route("cam", "FROM /messages/modules/cam/outputs/P0_Alerts INTO BrokeredEndpoint(\"/modules/s/inputs/i\")", 1),
    ])
    assert [r.endpoint.id for r in evaluator.evaluate(alerts)] == [UPSTREAM]
    assert [r.endpoint.id for r in evaluator.evaluate(module)] == ["modules/s/inputs/i"]
    assert message_from_publish("devices/gw/modules/s/inputs/i", b"", [], None) is None
    assert message_from_publish("devices/t1/twin", b"", [], None) is None
