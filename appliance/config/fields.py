"""Small typed accessors that every config section uses, so each error names the exact field path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from appliance.config.errors import ConfigError

T = TypeVar("T")


def join(path: str, key: str | int) -> str:
    """Extend a dotted path with a key or a list index."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def require_table(raw: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"expected a table, got {type(raw).__name__}")
    return raw


def reject_unknown(raw: Mapping[str, Any], path: str, known: Iterable[str]) -> None:
    """Unknown keys are almost always typos; refusing them beats silently ignoring a setting."""
    allowed = set(known)
    for key in raw:
        if key not in allowed:
            raise ConfigError(join(path, key), f"unknown setting (expected one of: {', '.join(sorted(allowed))})")


def get_str(raw: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(join(path, key), f"expected a string, got {type(value).__name__}")
    return value


def get_optional_str(raw: Mapping[str, Any], key: str, path: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(join(path, key), f"expected a string, got {type(value).__name__}")
    return value


def get_int(
    raw: Mapping[str, Any],
    key: str,
    path: str,
    default: int | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(join(path, key), f"expected an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ConfigError(join(path, key), f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(join(path, key), f"must be <= {maximum}, got {value}")
    return value


def get_float(raw: Mapping[str, Any], key: str, path: str, default: float | None = None, minimum: float | None = None) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(join(path, key), f"expected a number, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ConfigError(join(path, key), f"must be >= {minimum}, got {value}")
    return float(value)


def get_bool(raw: Mapping[str, Any], key: str, path: str, default: bool | None = None) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(join(path, key), f"expected true or false, got {type(value).__name__}")
    return value


def get_choice(raw: Mapping[str, Any], key: str, path: str, choices: Iterable[str], default: str) -> str:
    value = get_str(raw, key, path, default)
    options = tuple(choices)
    if value not in options:
        raise ConfigError(join(path, key), f"must be one of {', '.join(options)}, got {value!r}")
    return value
