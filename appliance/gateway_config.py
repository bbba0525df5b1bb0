"""Read the gateway's one configuration file and build typed, validated settings.

Each subsystem owns the schema of its own section (the dataclasses of ``appliance.<area>.config``, one
field per setting); this module composes them into ``ConfigFile``, which ``appliance.config.schema``
parses in one pass, applies command-line overrides, and falls back to the embedded default
(``default.toml``) so ``appliance run`` works with no file at all. A bad file raises ``ConfigError``
with the path of the bad field and leaves any running configuration untouched: parsing never mutates.
"""

from __future__ import annotations

import json
import pkgutil
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from appliance.broker import config as broker_config
from appliance.config.errors import ConfigError
from appliance.config.schema import join, parse_section, require_table, setting
from appliance.firmware import config as firmware_config
from appliance.forwarding import config as forwarding_config
from appliance.forwarding.validity import level_problem
from appliance.hardware import config as hardware_config
from appliance.statestore import config as statestore_config


@dataclass(frozen=True, slots=True)
class GatewaySection:
    id: str = setting(factory=socket.gethostname, shown_default="the host name", doc="names this gateway upstream and in $SYS")
    data_dir: Path = setting(Path("var"), doc="where the databases live; --data-dir overrides it")
    log_level: Literal["debug", "info", "warning", "error"] = setting("info", doc="the lowest level the gateway logs (stdout)")
    metrics_port: int | None = setting(
        None, minimum=0, maximum=65535, doc="the gateway's Prometheus page (/metrics); 0: any free port, absent: off"
    )
    metrics_host: str = setting("127.0.0.1", doc="address of the Prometheus page")

    def checked(self, given: Mapping[str, Any], path: str) -> GatewaySection:
        """The id is one level of every upstream topic and of ``$SYS``: a wildcard, '/' or control
        character in it would make every forwarded message unsendable."""
        problem = level_problem("the gateway id", self.id)
        if problem is not None:
            raise ConfigError(join(path, "id"), problem.detail)
        return self


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """The file's top level: one table per section, each optional."""

    gateway: GatewaySection = setting(factory=GatewaySection)
    broker: broker_config.BrokerConfig = setting(factory=broker_config.BrokerConfig)
    statestore: statestore_config.StateStoreConfig = setting(factory=statestore_config.StateStoreConfig)
    forwarding: forwarding_config.ForwardingConfig = setting(factory=forwarding_config.ForwardingConfig)
    hardware: hardware_config.HardwareConfig = setting(factory=hardware_config.HardwareConfig)
    firmware: firmware_config.FirmwareConfig = setting(factory=firmware_config.FirmwareConfig)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    gateway_id: str
    data_dir: Path
    log_level: str
    metrics_port: int | None
    metrics_host: str
    broker: broker_config.BrokerConfig
    statestore: statestore_config.StateStoreConfig
    forwarding: forwarding_config.ForwardingConfig
    hardware: hardware_config.HardwareConfig
    firmware: firmware_config.FirmwareConfig
    source: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view, for ``appliance check-config``."""
        from dataclasses import asdict

        view: dict[str, Any] = json.loads(json.dumps(asdict(self), default=str))
        return view


def default_config_text() -> str:
    """``default.toml`` as the package carries it, read through the package's loader (a checkout, a wheel, a
    zip). ``pkgutil.get_data``, not ``importlib.resources``: the same file for a third of the import cost
    (``importlib.resources`` and the ``zipfile`` its readers import were ~4 ms of every gateway start)."""
    data = pkgutil.get_data("appliance.config", "default.toml")
    if data is None:  # a loader without get_data; every loader of the standard library has it
        raise ConfigError("", "the embedded default configuration cannot be read from this installation")
    return data.decode("utf-8")


def parse_text(text: str, source: str) -> dict[str, Any]:
    """TOML or JSON by the file name; JSON files are common when configs come from a fleet manager."""
    try:
        raw = json.loads(text) if source.endswith(".json") else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("", f"{source}: not valid {'JSON' if source.endswith('.json') else 'TOML'}: {exc}") from exc
    return dict(require_table(raw, ""))


def build(raw: dict[str, Any], source: str, base_dir: Path) -> GatewayConfig:
    file = parse_section(ConfigFile, raw, "", base_dir)
    return GatewayConfig(
        gateway_id=file.gateway.id,
        data_dir=file.gateway.data_dir,
        log_level=file.gateway.log_level,
        metrics_port=file.gateway.metrics_port,
        metrics_host=file.gateway.metrics_host,
        broker=file.broker,
        statestore=file.statestore,
        forwarding=file.forwarding,
        hardware=file.hardware,
        firmware=file.firmware,
        source=source,
    )


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Load ``path`` (or the embedded default) and apply ``overrides``, a nested dict of the same shape.

    Relative paths in the file resolve against the file's folder; for the embedded default they resolve
    against the current directory, which is what ``make run`` from a checkout expects (``./var``).
    """
    return build(*read_raw(path, overrides))


def read_raw(path: str | Path | None, overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], str, Path]:
    """The file's tables with ``overrides`` merged in, its name and the folder its relative paths start from."""
    if path is None:
        text, source, base_dir = default_config_text(), "<embedded default>", Path.cwd()
    else:
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 ({exc.reason})"
            raise ConfigError("", f"cannot read {file}: {reason}") from exc
        source, base_dir = str(file), file.resolve().parent
    raw = parse_text(text, source)
    return (merge(raw, overrides) if overrides else raw), source, base_dir


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` into a copy of ``base``; tables merge, everything else replaces."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged
