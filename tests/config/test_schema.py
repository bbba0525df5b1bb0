"""The declarative schema: one field per setting, one parser, and the rules it applies to every section."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from appliance.broker.config import BrokerConfig, ListenerConfig
from appliance.config import ConfigError
from appliance.config.reference import settings
from appliance.config.schema import parse_section, setting
from appliance.forwarding.config import ForwardingConfig
from appliance.gateway_config import ConfigFile
from appliance.hardware.config import HardwareConfig
from appliance.statestore.config import StateStoreConfig

BASE = Path("/etc/gateway")


@dataclass(frozen=True, slots=True)
class Item:
    name: str = setting(doc="required: no default")
    weight: float = setting(1.0, minimum=0.0, maximum=10.0)


@dataclass(frozen=True, slots=True)
class Sample:
    """A section using every kind of field the parser knows."""

    flag: bool = setting(False)
    count: int = setting(3, minimum=1, maximum=5)
    mode: Literal["fast", "safe"] = setting("safe")
    file: Path = setting(Path("data"))
    optional_file: Path | None = setting(None)
    limit: int | None = setting(None, minimum=10)
    tags: tuple[str, ...] = setting(("a",), minimum=1)
    items: tuple[Item, ...] = setting(())
    nested: Item = setting(factory=lambda: Item("inner"))


def parse(raw: dict[str, object]) -> Sample:
    return parse_section(Sample, raw, "sample", BASE)


def test_an_empty_table_gives_the_field_defaults_with_paths_resolved() -> None:
    assert parse({}) == dataclasses.replace(Sample(), file=BASE / "data")


def test_every_kind_of_field_parses() -> None:
    sample = parse(
        {
            "flag": True, "count": 5, "mode": "fast", "file": "/var/x", "optional_file": "y", "limit": 10,
            "tags": ["b", "c"], "items": [{"name": "one"}, {"name": "two", "weight": 2}], "nested": {"name": "n"},
        }
    )
    assert sample == Sample(
        True, 5, "fast", Path("/var/x"), BASE / "y", 10, ("b", "c"), (Item("one"), Item("two", 2.0)), Item("n")
    )
    assert isinstance(sample.items[1].weight, float)


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        ({"flag": "yes"}, "sample.flag", "expected true or false, got str"),
        ({"count": True}, "sample.count", "expected an integer, got bool"),
        ({"count": 1.5}, "sample.count", "expected an integer, got float"),
        ({"count": 0}, "sample.count", "must be >= 1, got 0"),
        ({"count": 6}, "sample.count", "must be <= 5, got 6"),
        ({"mode": "quick"}, "sample.mode", "must be one of fast, safe, got 'quick'"),
        ({"mode": 1}, "sample.mode", "expected a string, got int"),
        ({"file": None}, "sample.file", "expected a string, got NoneType"),
        ({"limit": 9}, "sample.limit", "must be >= 10, got 9"),
        ({"tags": "a"}, "sample.tags", "expected a list of strings, got str"),
        ({"tags": []}, "sample.tags", "expected a non-empty list of strings"),
        ({"tags": ["a", 2]}, "sample.tags", "item 1: expected a string, got int"),
        ({"items": [{"name": "x"}, {"weight": 1}]}, "sample.items[1].name", "required: expected string"),
        ({"items": [{"name": "x", "weight": 11}]}, "sample.items[0].weight", "must be <= 10.0, got 11"),
        ({"items": ["x"]}, "sample.items[0]", "expected a table, got str"),
        ({"nested": {"name": "x", "heavy": 1}}, "sample.nested.heavy", "unknown setting (expected one of: name, weight)"),
        ({"nested": {"weight": float("nan"), "name": "x"}}, "sample.nested.weight", "expected a finite number, got nan"),
        ({"nested": {"weight": float("inf"), "name": "x"}}, "sample.nested.weight", "expected a finite number, got inf"),
    ],
)
def test_each_error_names_its_field(raw: dict[str, object], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    assert (caught.value.path, caught.value.message) == (path, message)


def test_null_means_absent_for_an_optional_setting() -> None:
    """JSON has null; TOML cannot write it, so it only ever means "not given"."""
    assert parse({"optional_file": None, "limit": None}) == parse({})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_in_the_real_sections(value: float) -> None:
    """TOML has nan and inf; a nan interval never compares below its minimum, an infinite one never fires."""
    with pytest.raises(ConfigError) as caught:
        parse_section(ForwardingConfig, {"watch_interval_s": value}, "forwarding", BASE)
    assert caught.value.path == "forwarding.watch_interval_s"


def test_a_default_is_written_once_the_dataclass_and_an_empty_table_agree() -> None:
    parsed = parse_section(ConfigFile, {}, "", BASE)
    assert (parsed.broker, parsed.statestore, parsed.forwarding, parsed.hardware) == (
        BrokerConfig(), StateStoreConfig(), ForwardingConfig(), HardwareConfig()
    )


def test_a_tls_listener_defaults_to_8883_unless_a_port_is_given() -> None:
    tls = {"type": "tls", "certfile": "c.pem", "keyfile": "k.pem"}
    assert parse_section(ListenerConfig, tls, "l", BASE).port == 8883
    assert parse_section(ListenerConfig, {**tls, "port": 1883}, "l", BASE).port == 1883
    assert parse_section(ListenerConfig, {"type": "websocket"}, "l", BASE).port == 1883


def test_acl_access_is_kept_sorted_and_once() -> None:
    config = parse_section(StateStoreConfig, {"acl": [{"user": "a", "access": ["write", "read", "write"]}]}, "statestore", BASE)
    assert config.acl[0].access == ("read", "write")


def test_the_reference_lists_every_setting_with_type_default_and_bounds() -> None:
    rows = {row.key: row for row in settings(Sample)}
    assert list(rows) == [
        "flag", "count", "mode", "file", "optional_file", "limit", "tags", "items", "items[].name", "items[].weight",
        "nested.name", "nested.weight",
    ]
    assert (rows["count"].type, rows["count"].default, rows["count"].bounds) == ("integer", "3", "1 - 5")
    assert (rows["mode"].type, rows["mode"].default) == ("one of fast, safe", '"safe"')
    assert (rows["limit"].type, rows["limit"].default, rows["limit"].bounds) == ("integer (optional)", "absent", ">= 10")
    assert (rows["tags"].type, rows["tags"].default, rows["tags"].bounds) == ("list of strings", '["a"]', "non-empty")
    assert (rows["items"].type, rows["items[].name"].default) == ("list of tables", "required")
