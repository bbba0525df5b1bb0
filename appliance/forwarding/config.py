"""Schema of the ``[forwarding]`` section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.config.fields import get_bool, reject_unknown


@dataclass(frozen=True, slots=True)
class ForwardingConfig:
    enabled: bool = False


def parse(raw: Mapping[str, Any], path: str, base_dir: Path) -> ForwardingConfig:
    reject_unknown(raw, path, ("enabled",))
    return ForwardingConfig(enabled=get_bool(raw, "enabled", path, False))
