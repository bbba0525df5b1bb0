"""Schema of the ``[statestore]`` section.

```toml
[statestore]
enabled = true
node_id = "StateStore"        # the node id in the versions (HLCs) this gateway issues
sync = "normal"               # "normal": survives a crash; "full": also survives power loss (fsync per commit)
max_keys = 1000000            # quota: number of keys
max_bytes = 268435456         # quota: total bytes of keys plus values
sweep_interval_ms = 1000      # upper bound between expiry sweeps (the sweep also wakes at each deadline)

[[statestore.acl]]            # no rules: everything allowed; any rule: closed by default
user = "thermostat-7"         # or "*" for every user, anonymous included
prefix = "thermostats/7/"
access = ["read", "write"]
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from appliance.config.errors import ConfigError
from appliance.config.fields import (
    get_bool,
    get_choice,
    get_int,
    get_str,
    join,
    reject_unknown,
    require_table,
)
from appliance.statestore.acl import ACCESS_KINDS, AclRule

SYNC_CHOICES = ("normal", "full")


@dataclass(frozen=True, slots=True)
class StateStoreConfig:
    enabled: bool = True
    node_id: str = "StateStore"
    sync: str = "normal"
    max_keys: int = 1_000_000
    max_bytes: int = 256 * 1024 * 1024
    sweep_interval_ms: int = 1000
    acl: tuple[AclRule, ...] = ()


def parse(raw: Mapping[str, Any], path: str) -> StateStoreConfig:
    reject_unknown(raw, path, ("enabled", "node_id", "sync", "max_keys", "max_bytes", "sweep_interval_ms", "acl"))
    defaults = StateStoreConfig()
    node_id = get_str(raw, "node_id", path, defaults.node_id)
    if not node_id or ":" in node_id or not node_id.isprintable():
        raise ConfigError(join(path, "node_id"), "must be non-empty printable text without ':'")
    return StateStoreConfig(
        enabled=get_bool(raw, "enabled", path, defaults.enabled),
        node_id=node_id,
        sync=get_choice(raw, "sync", path, SYNC_CHOICES, defaults.sync),
        max_keys=get_int(raw, "max_keys", path, defaults.max_keys, minimum=1),
        max_bytes=get_int(raw, "max_bytes", path, defaults.max_bytes, minimum=1),
        sweep_interval_ms=get_int(raw, "sweep_interval_ms", path, defaults.sweep_interval_ms, minimum=1),
        acl=parse_acl(raw.get("acl", []), join(path, "acl")),
    )


def parse_acl(raw: Any, path: str) -> tuple[AclRule, ...]:
    if not isinstance(raw, list):
        raise ConfigError(path, f"expected a list of tables, got {type(raw).__name__}")
    rules = []
    for index, item in enumerate(raw):
        item_path = join(path, index)
        table = require_table(item, item_path)
        reject_unknown(table, item_path, ("user", "prefix", "access"))
        user = get_str(table, "user", item_path)
        prefix = get_str(table, "prefix", item_path, "")
        access = table.get("access")
        if not isinstance(access, list) or not access or any(kind not in ACCESS_KINDS for kind in access):
            raise ConfigError(join(item_path, "access"), f"expected a non-empty list of {', '.join(ACCESS_KINDS)}")
        rules.append(AclRule(user, prefix, tuple(sorted(set(access)))))
    return tuple(rules)
