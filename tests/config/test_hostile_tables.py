"""Hostile configuration tables: whatever a file holds, loading it returns a configuration or raises
``ConfigError`` naming a place in that file - never another exception.

The tables are drawn from the schema itself (every section, every known key, with values of the right
type near their bounds, of the wrong type, or nested garbage) plus unknown keys, so a setting added
later is fuzzed without touching this file.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from hypothesis import example, given
from hypothesis import strategies as st

from appliance.config import ConfigError
from appliance.config.schema import SETTING, Setting
from appliance.gateway_config import ConfigFile, build
from testing.campaigns import campaign

#: Bare TOML keys; an unknown one may still look like a known one.
KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-0123456789", min_size=1, max_size=12)
TEMPLATE_OR_PATTERN = "{}[]._:!0gateway_id device_ %cx#+/readwritedeny"
SCALARS = st.one_of(
    st.none(),  # JSON's null
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),  # nan and inf included: TOML has both
    st.text(max_size=20),
    st.text(alphabet=TEMPLATE_OR_PATTERN, max_size=30),  # templates, ACL patterns
)
GARBAGE = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3), max_leaves=8)


def one_in(n: int, rare: st.SearchStrategy[Any], otherwise: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.sampled_from([otherwise] * (n - 1) + [rare]).flatmap(lambda chosen: chosen)


def values_for(hint: Any, meta: Setting) -> st.SearchStrategy[Any]:
    """Values a field of type ``hint`` could be given: mostly plausible or on a bound, sometimes garbage
    (one bad value ends the load, so garbage everywhere would never reach the deeper tables)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = (arg for arg in args if arg is not type(None))
        return values_for(inner, meta)
    if origin is Literal:
        plausible: st.SearchStrategy[Any] = st.sampled_from(args)
    elif origin is tuple:
        plausible = st.lists(values_for(args[0], Setting()), max_size=3)
    elif dataclasses.is_dataclass(hint):
        plausible = tables_for(hint)
    elif hint is bool:
        plausible = st.booleans()
    elif hint in (int, float):
        low, high = meta.minimum, meta.maximum
        edges = [bound + step for bound in (low, high) if bound is not None for step in (-1, 0, 1)]
        inside = st.integers(min_value=None if low is None else int(low), max_value=None if high is None else int(high))
        plausible = inside | st.sampled_from(edges or [0]) | (st.floats() if hint is float else inside)
    else:
        plausible = st.text(max_size=20) | st.text(alphabet=TEMPLATE_OR_PATTERN, max_size=30)
    return one_in(10, GARBAGE, otherwise=plausible)


def tables_for(cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    """A table of ``cls``'s known keys, one in sixteen with an unknown key too."""
    hints = typing.get_type_hints(cls)
    known = {
        field.name: values_for(hints[field.name], field.metadata.get(SETTING, Setting())) for field in dataclasses.fields(cls)
    }
    unknown = one_in(16, st.dictionaries(KEYS, GARBAGE, min_size=1, max_size=1), otherwise=st.just({}))
    return st.tuples(st.fixed_dictionaries({}, optional=known), unknown).map(lambda parts: {**parts[1], **parts[0]})


def place_exists(raw: Any, path: str) -> bool:
    """Does ``path`` (``a.b[2].c``) name a table or list in ``raw`` holding its last key (which may be
    absent: a missing required key, or a rule about a field left at its default)?"""
    steps = [int(index) if index else key for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path)]
    if not steps:
        return True
    node = raw
    for step in steps[:-1]:
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                return False
        elif not isinstance(node, dict) or step not in node:
            return False
        node = node[step]
    return isinstance(node, (dict, list))


@campaign(300, deadline=None)
@given(tables_for(ConfigFile) | GARBAGE.filter(lambda value: isinstance(value, dict)))
@example({"forwarding": {"upstream": {"topic_template": "{gateway_id.real}"}}})
@example({"forwarding": {"watch_interval_s": float("nan")}})
@example({"broker": {"listeners": [{"type": "tls", "certfile": "c"}]}})
@example({"statestore": {"acl": [{"access": ["read"]}]}})
def test_any_table_loads_or_names_a_place_in_it(raw: dict[str, Any]) -> None:
    try:
        config = build(raw, "<hypothesis>", Path("/etc/gateway"))
    except ConfigError as error:
        assert error.message
        assert place_exists(raw, error.path), f"{error.path!r} is not a place in {raw!r}"
    else:
        config.to_dict()  # what check-config prints


def test_place_exists_reads_paths_as_the_errors_write_them() -> None:
    raw = {"broker": {"listeners": [{"port": 1}]}}
    assert place_exists(raw, "broker.listeners[0].port") and place_exists(raw, "broker.listeners[0].certfile")
    assert not place_exists(raw, "broker.listeners[1].port") and not place_exists(raw, "forwarding.upstream.port")
