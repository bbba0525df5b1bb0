"""The WHERE language against Edge Hub's own compiler test table (ConditionCompilerTest), plus our columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.forwarding.conditions import UNDEFINED, DictMessage, compile_condition
from appliance.forwarding.lexer import RouteSyntaxError

DATA = Path(__file__).parent / "data"
EXPECTED = {"T": True, "F": False, "U": UNDEFINED}

# Edge Hub's Message1.
MESSAGE = DictMessage(
    properties={"key1": "value1", "key2": "3", "key3": "VALUE3", "null_value": None, "$sys4": "value4"},
    system={"sys1": "sysvalue1", "sys2": "4", "sys3": "SYSVALUE3", "sysnull": None, "sys4": "sysvalue4"},
)


def _rows(name: str) -> list[str]:
    lines = (DATA / name).read_text(encoding="utf-8").split("\n")
    return [line for line in lines if line and not line.startswith("#")]


RESULTS = [tuple(line.split("\t", 1)) for line in _rows("condition_results.txt")]


@pytest.mark.parametrize(("expected", "condition"), RESULTS, ids=[c or "<empty>" for _, c in RESULTS])
def test_condition_result(expected: str, condition: str) -> None:
    assert compile_condition(condition).evaluate(MESSAGE) is EXPECTED[expected]


@pytest.mark.parametrize("condition", _rows("condition_failures.txt"))
def test_condition_refused_at_compile_time(condition: str) -> None:
    with pytest.raises(RouteSyntaxError):
        compile_condition(condition)


def test_substring_limits_never_raise() -> None:
    for i in range(-10, 11):
        compile_condition(f"substring('hello', {i}) = 'he'").evaluate(MESSAGE)
        for j in range(-10, 11):
            compile_condition(f"substring('hello', {i}, {j}) = 'he'").evaluate(MESSAGE)


@pytest.mark.parametrize(
    ("condition", "column", "fragment"),
    [
        ("key1 = 'a' and (3 > 2", 16, "missing closing ')'"),
        ("3 + key1 > 2", 3, "number operands"),
        ("nosuch(1) = 1", 1, "unknown function"),
        ("key1 = 'abc", 8, "unterminated string"),
        ("true)", 5, "unmatched closing ')'"),
        ("key1 = 'a' @", 12, "unrecognized character"),
    ],
)
def test_errors_point_at_the_column(condition: str, column: int, fragment: str) -> None:
    with pytest.raises(RouteSyntaxError) as info:
        compile_condition(condition)
    assert info.value.column == column
    assert fragment in info.value.message


def test_body_queries_need_a_json_content_type() -> None:
    condition = compile_condition("$body.temperature > 30 AND $body.site.rooms[1] = 'b'")
    body = b'{"temperature": 31.5, "site": {"rooms": ["a", "b"]}}'
    assert condition.matches(DictMessage({}, {}, body, "application/json"))
    assert condition.evaluate(DictMessage({}, {}, body, None)) is UNDEFINED
    assert not compile_condition("$body.temperature > 30").matches(DictMessage({}, {}, b'{"temperature": 29}', "application/json"))


def test_an_application_property_shadows_a_system_property_unless_escaped() -> None:
    message = DictMessage({"$connectionDeviceId": "app"}, {"connectionDeviceId": "dev1"})
    assert compile_condition("$connectionDeviceId = 'app'").matches(message)
    assert compile_condition("{$connectionDeviceId} = 'dev1'").matches(message)
