"""Schema of the ``[broker]`` section: listeners, limits and authentication."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.config.errors import ConfigError
from appliance.config.fields import get_bool, get_choice, get_int, get_optional_str, get_str, join, reject_unknown, require_table


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    type: str
    host: str
    port: int
    certfile: Path | None = None
    keyfile: Path | None = None
    cafile: Path | None = None
    require_certificate: bool = False


@dataclass(frozen=True, slots=True)
class AuthConfig:
    allow_anonymous: bool = True
    password_file: Path | None = None
    acl_file: Path | None = None


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    listeners: tuple[ListenerConfig, ...]
    auth: AuthConfig = field(default_factory=AuthConfig)


def _path(raw: Mapping[str, Any], key: str, path: str, base_dir: Path) -> Path | None:
    value = get_optional_str(raw, key, path)
    if value is None:
        return None
    resolved = Path(value)
    return resolved if resolved.is_absolute() else base_dir / resolved


def parse_listener(raw: Any, path: str, base_dir: Path) -> ListenerConfig:
    table = require_table(raw, path)
    reject_unknown(table, path, ("type", "host", "port", "certfile", "keyfile", "cafile", "require_certificate"))
    kind = get_choice(table, "type", path, ("tcp", "tls", "websocket"), "tcp")
    listener = ListenerConfig(
        type=kind,
        host=get_str(table, "host", path, "127.0.0.1"),
        port=get_int(table, "port", path, 8883 if kind == "tls" else 1883, minimum=0, maximum=65535),
        certfile=_path(table, "certfile", path, base_dir),
        keyfile=_path(table, "keyfile", path, base_dir),
        cafile=_path(table, "cafile", path, base_dir),
        require_certificate=get_bool(table, "require_certificate", path, False),
    )
    if kind == "tls" and (listener.certfile is None or listener.keyfile is None):
        raise ConfigError(join(path, "certfile"), "a tls listener needs certfile and keyfile")
    return listener


def parse(raw: Mapping[str, Any], path: str, base_dir: Path) -> BrokerConfig:
    reject_unknown(raw, path, ("listeners", "auth"))
    listeners_raw = raw.get("listeners", [{"type": "tcp", "host": "127.0.0.1", "port": 1883}])
    if not isinstance(listeners_raw, list) or not listeners_raw:
        raise ConfigError(join(path, "listeners"), "expected a non-empty list of listeners")
    listeners = tuple(
        parse_listener(item, join(join(path, "listeners"), index), base_dir) for index, item in enumerate(listeners_raw)
    )
    auth_path = join(path, "auth")
    auth_raw = require_table(raw.get("auth", {}), auth_path)
    reject_unknown(auth_raw, auth_path, ("allow_anonymous", "password_file", "acl_file"))
    auth = AuthConfig(
        allow_anonymous=get_bool(auth_raw, "allow_anonymous", auth_path, True),
        password_file=_path(auth_raw, "password_file", auth_path, base_dir),
        acl_file=_path(auth_raw, "acl_file", auth_path, base_dir),
    )
    return BrokerConfig(listeners=listeners, auth=auth)
