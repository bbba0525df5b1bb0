"""Schema of the ``[hardware]`` section. Everything is off by default: most machines have no GPIO or modem."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from appliance.config.fields import get_bool, reject_unknown


@dataclass(frozen=True, slots=True)
class HardwareConfig:
    enabled: bool = False


def parse(raw: Mapping[str, Any], path: str) -> HardwareConfig:
    reject_unknown(raw, path, ("enabled",))
    return HardwareConfig(enabled=get_bool(raw, "enabled", path, False))
