"""Schema of the ``[statestore]`` section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from appliance.config.fields import get_bool, reject_unknown


@dataclass(frozen=True, slots=True)
class StateStoreConfig:
    enabled: bool = True


def parse(raw: Mapping[str, Any], path: str) -> StateStoreConfig:
    reject_unknown(raw, path, ("enabled",))
    return StateStoreConfig(enabled=get_bool(raw, "enabled", path, True))
