"""The ``[statestore]`` section: defaults, every setting, and errors that name the field path."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.config import ConfigError
from appliance.config.schema import parse_section
from appliance.statestore.acl import AclRule
from appliance.statestore.config import StateStoreConfig


def parse(raw: dict[str, object], path: str) -> StateStoreConfig:
    return parse_section(StateStoreConfig, raw, path, Path.cwd())


def test_defaults() -> None:
    assert parse({}, "statestore") == StateStoreConfig()


def test_every_setting() -> None:
    config = parse(
        {
            "enabled": False, "node_id": "gw-7", "sync": "full", "max_keys": 10, "max_bytes": 1000, "sweep_interval_ms": 50,
            "acl": [{"user": "alice", "prefix": "alice/", "access": ["read", "write"]}, {"user": "*", "access": ["read"]}],
        },
        "statestore",
    )
    assert config == StateStoreConfig(
        enabled=False, node_id="gw-7", sync="full", max_keys=10, max_bytes=1000, sweep_interval_ms=50,
        acl=(AclRule("alice", "alice/", ("read", "write")), AclRule("*", "", ("read",))),
    )


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"sync": "sometimes"}, "statestore.sync"),
        ({"max_keys": 0}, "statestore.max_keys"),
        ({"max_bytes": "big"}, "statestore.max_bytes"),
        ({"node_id": "a:b"}, "statestore.node_id"),
        ({"node_id": ""}, "statestore.node_id"),
        ({"quota": 1}, "statestore.quota"),
        ({"acl": {}}, "statestore.acl"),
        ({"acl": [{"user": "a", "access": ["delete"]}]}, "statestore.acl[0].access"),
        ({"acl": [{"prefix": "x", "access": ["read"]}]}, "statestore.acl[0].user"),
        ({"acl": [{"user": "a", "access": ["read"], "extra": 1}]}, "statestore.acl[0].extra"),
    ],
)
def test_errors_name_the_field(raw: dict[str, object], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(raw, "statestore")
    assert caught.value.path == path
