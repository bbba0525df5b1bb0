"""Schema of the ``[statestore]`` section; every key is optional (reference: docs/configuration.md).

```toml
[statestore]
node_id = "gw-7"              # the node id in the versions (HLCs) this gateway issues
sync = "full"                 # "normal": survives a crash; "full": also survives power loss (fsync per commit)
max_keys = 10000              # quota: number of keys

[[statestore.acl]]            # no rules: everything allowed; any rule: closed by default
user = "thermostat-7"         # or "*" for every user, anonymous included
prefix = "thermostats/7/"
access = ["read", "write"]
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from appliance.config.errors import ConfigError
from appliance.config.schema import join, setting
from appliance.statestore.acl import AclRule


@dataclass(frozen=True, slots=True)
class StateStoreConfig:
    enabled: bool = setting(True, doc="serve the state store protocol on the broker")
    node_id: str = setting("StateStore", doc="the node id in the versions (HLCs) this gateway issues; printable, no ':'")
    sync: Literal["normal", "full"] = setting(
        "normal", doc='statestore.db: "normal" survives a crash, "full" also power loss (an fsync per commit)'
    )
    max_keys: int = setting(1_000_000, minimum=1, doc="quota: number of keys")
    max_bytes: int = setting(256 * 1024 * 1024, minimum=1, doc="quota: total bytes of keys plus values")
    sweep_interval_ms: int = setting(
        1000, minimum=1, doc="upper bound between expiry sweeps (the sweep also wakes at each deadline)"
    )
    acl: tuple[AclRule, ...] = setting((), doc="[[statestore.acl]] rules; none: everything allowed, any: closed by default")

    def checked(self, given: Mapping[str, Any], path: str) -> StateStoreConfig:
        if not self.node_id or ":" in self.node_id or not self.node_id.isprintable():
            raise ConfigError(join(path, "node_id"), "must be non-empty printable text without ':'")
        return self
