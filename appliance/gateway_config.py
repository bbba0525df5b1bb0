"""Read the gateway's one configuration file and build typed, validated settings.

Each subsystem owns the schema of its own section (``appliance.<area>.config.parse``); this module only
composes them, applies command-line overrides, and falls back to the embedded default
(``default.toml``) so ``appliance run`` works with no file at all. A bad file raises ``ConfigError``
with the path of the bad field and leaves any running configuration untouched: parsing never mutates.
"""

from __future__ import annotations

import json
import socket
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from appliance.broker import config as broker_config
from appliance.config.errors import ConfigError
from appliance.config.fields import get_choice, get_int, get_str, reject_unknown, require_table
from appliance.forwarding import config as forwarding_config
from appliance.hardware import config as hardware_config
from appliance.statestore import config as statestore_config

SECTIONS = ("gateway", "broker", "statestore", "forwarding", "hardware")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    gateway_id: str
    data_dir: Path
    log_level: str
    #: The Prometheus page (``/metrics``) of the whole gateway: None = off, 0 = any free port.
    metrics_port: int | None
    metrics_host: str
    broker: broker_config.BrokerConfig
    statestore: statestore_config.StateStoreConfig
    forwarding: forwarding_config.ForwardingConfig
    hardware: hardware_config.HardwareConfig
    source: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view, for ``appliance check-config``."""
        from dataclasses import asdict

        raw = asdict(self)
        return json.loads(json.dumps(raw, default=str))


def default_config_text() -> str:
    return resources.files("appliance.config").joinpath("default.toml").read_text(encoding="utf-8")


def parse_text(text: str, source: str) -> dict[str, Any]:
    """TOML or JSON by the file name; JSON files are common when configs come from a fleet manager."""
    try:
        raw = json.loads(text) if source.endswith(".json") else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("", f"{source}: not valid {'JSON' if source.endswith('.json') else 'TOML'}: {exc}") from exc
    return dict(require_table(raw, ""))


def build(raw: dict[str, Any], source: str, base_dir: Path) -> GatewayConfig:
    reject_unknown(raw, "", SECTIONS)
    gateway = require_table(raw.get("gateway", {}), "gateway")
    reject_unknown(gateway, "gateway", ("id", "data_dir", "log_level", "metrics_port", "metrics_host"))
    data_dir = Path(get_str(gateway, "data_dir", "gateway", "var"))
    if not data_dir.is_absolute():
        data_dir = base_dir / data_dir
    return GatewayConfig(
        gateway_id=get_str(gateway, "id", "gateway", socket.gethostname()),
        data_dir=data_dir,
        log_level=get_choice(gateway, "log_level", "gateway", LOG_LEVELS, "info"),
        metrics_port=None if gateway.get("metrics_port") is None
        else get_int(gateway, "metrics_port", "gateway", minimum=0, maximum=65535),
        metrics_host=get_str(gateway, "metrics_host", "gateway", "127.0.0.1"),
        broker=broker_config.parse(require_table(raw.get("broker", {}), "broker"), "broker", base_dir),
        statestore=statestore_config.parse(require_table(raw.get("statestore", {}), "statestore"), "statestore"),
        forwarding=forwarding_config.parse(require_table(raw.get("forwarding", {}), "forwarding"), "forwarding", base_dir),
        hardware=hardware_config.parse(require_table(raw.get("hardware", {}), "hardware"), "hardware"),
        source=source,
    )


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Load ``path`` (or the embedded default) and apply ``overrides``, a nested dict of the same shape.

    Relative paths in the file resolve against the file's folder; for the embedded default they resolve
    against the current directory, which is what ``make run`` from a checkout expects (``./var``).
    """
    if path is None:
        text, source, base_dir = default_config_text(), "<embedded default>", Path.cwd()
    else:
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("", f"cannot read {file}: {exc.strerror}") from exc
        source, base_dir = str(file), file.resolve().parent
    raw = parse_text(text, source)
    if overrides:
        raw = merge(raw, overrides)
    return build(raw, source, base_dir)


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` into a copy of ``base``; tables merge, everything else replaces."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged
