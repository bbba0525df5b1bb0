"""One parser for every configuration section, driven by the section's dataclass.

A setting is written once, as a field of its section's frozen dataclass: the name is the field's, the
type its annotation, and the default, bounds and one line of documentation its ``setting(...)``::

    max_packet_size: int = setting(4 * 1024 * 1024, minimum=64, maximum=268_435_460, doc="...")

``parse_section(Section, raw, path, base_dir)`` builds a section from its raw table (TOML or JSON): it
reads the type hints, applies the defaults, checks the bounds, refuses unknown keys (naming the known
ones) and raises ``ConfigError`` with the dotted path of the field it rejects
(``broker.listeners[0].port``). Types it understands: ``bool``, ``int``, ``float`` (finite), ``str``,
``Literal[...]`` (choices), ``Path`` (relative to the configuration file's folder, a default too),
``X | None`` (absent or null: None), ``tuple[X, ...]`` (a list; ``minimum``/``maximum`` bound its
length), and another section dataclass, alone or in a tuple (a table, a list of tables).

Rules between fields (a TLS listener needs its key and certificate, a backoff ceiling at least its floor)
are a section's ``checked(self, given, path)`` method, called with the raw table after the fields are
parsed; it raises ``ConfigError`` naming a field, or returns the section (or a replacement, for a default
that depends on another field). ``appliance.config.reference`` walks the same fields for the generated
settings reference (``appliance check-config --schema``, docs/configuration.md).

Errors: by default the first bad field raises. Inside ``collecting_errors()`` (``appliance check-config``)
every bad field, unknown key and failed rule is recorded instead and parsing goes on with the next field, so
one run names them all; a section with an error then raises ``SectionRejected`` (already recorded) to its
parent, which goes on with its own next field.

Why not msgspec: see docs/architecture.md ("Configuration").
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from appliance.config.errors import ConfigError

S = TypeVar("S")

#: The key of a field's ``metadata`` that holds its ``Setting``.
SETTING = "appliance.setting"

#: Where ``collecting_errors`` records errors; None: raise the first.
_COLLECTED: ContextVar[list[ConfigError] | None] = ContextVar("config_errors", default=None)


class SectionRejected(ConfigError):
    """A section with errors that are already recorded (``collecting_errors``)."""


@contextlib.contextmanager
def collecting_errors() -> Iterator[list[ConfigError]]:
    """Within: every error is appended to the yielded list rather than raised, as far as parsing can go on."""
    errors: list[ConfigError] = []
    token = _COLLECTED.set(errors)
    try:
        yield errors
    finally:
        _COLLECTED.reset(token)


def _record(exc: ConfigError) -> None:
    """Record ``exc`` while collecting (a ``SectionRejected`` is recorded already), else raise it."""
    collected = _COLLECTED.get()
    if collected is None:
        raise exc
    if not isinstance(exc, SectionRejected):
        collected.append(exc)


@dataclass(frozen=True, slots=True)
class Setting:
    """What a field's type cannot say: bounds (a value for numbers, a length for lists) and its doc."""

    minimum: float | None = None
    maximum: float | None = None
    doc: str = ""
    #: How the reference shows a default computed at load time (``gateway.id``: "the host name").
    shown_default: str | None = None


def setting(
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    doc: str = "",
    shown_default: str | None = None,
) -> Any:
    """A dataclass field carrying its ``Setting``; no default and no factory: the key is required."""
    metadata = {SETTING: Setting(minimum, maximum, doc, shown_default)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def parse_section(cls: type[S], raw: Any, path: str, base_dir: Path) -> S:
    """Build ``cls`` from ``raw`` (a table), every error naming its field path under ``path``."""
    table = require_table(raw, path)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    failed = False
    for unknown in unknown_keys(table, (field.name for field in fields)):
        _record(unknown_setting(path, unknown, (field.name for field in fields)))
        failed = True
    types_of = field_types(cls)
    values: dict[str, Any] = {}
    for field in fields:
        field_path = join(path, field.name)
        meta = field.metadata.get(SETTING, Setting())
        try:
            if field.name in table:
                values[field.name] = _convert(types_of[field.name], table[field.name], field_path, meta, base_dir)
            elif field.default is not MISSING:
                values[field.name] = _resolve(field.default, base_dir) if isinstance(field.default, Path) else field.default
            elif field.default_factory is not MISSING:
                values[field.name] = field.default_factory()
            else:
                raise ConfigError(field_path, f"required: expected {describe_type(types_of[field.name])}")
        except ConfigError as exc:
            _record(exc)
            failed = True
    if failed:
        raise SectionRejected(path, "rejected")
    section = cls(**values)
    checked = getattr(section, "checked", None)
    if checked is None:
        return section
    try:
        return typing.cast(S, checked(table, path))
    except ConfigError as exc:
        _record(exc)
        raise SectionRejected(path, "rejected") from None


def field_types(cls: type) -> dict[str, Any]:
    """The field types of a section (the annotations are strings under ``from __future__ import annotations``)."""
    return typing.get_type_hints(cls)


def join(path: str, key: str | int) -> str:
    """Extend a dotted path with a key or a list index."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def require_table(raw: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"expected a table, got {type(raw).__name__}")
    return raw


def unknown_keys(raw: Mapping[str, Any], known: Iterable[str]) -> list[str]:
    """Unknown keys are almost always typos; refusing them beats silently ignoring a setting."""
    allowed = set(known)
    return [key for key in raw if key not in allowed]


def unknown_setting(path: str, key: str, known: Iterable[str]) -> ConfigError:
    return ConfigError(join(path, key), f"unknown setting (expected one of: {', '.join(sorted(set(known)))})")


def _convert(hint: Any, value: Any, path: str, meta: Setting, base_dir: Path) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = (arg for arg in args if arg is not type(None))
        return _convert(inner, value, path, meta, base_dir)
    if origin is Literal:
        text = _expect(str, value, path)
        if text not in args:
            raise ConfigError(path, f"must be one of {', '.join(args)}, got {text!r}")
        return text
    if origin is tuple:
        return _convert_list(args[0], value, path, meta, base_dir)
    if dataclasses.is_dataclass(hint):
        return parse_section(hint, value, path, base_dir)  # type: ignore[arg-type]
    if hint is bool:
        return _expect(bool, value, path)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {type(value).__name__}")
        return _bounded(value, path, meta)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ConfigError(path, f"expected a finite number, got {value}")
        return float(_bounded(value, path, meta))
    if hint is str:
        return _expect(str, value, path)
    if hint is Path:
        return _resolve(Path(_expect(str, value, path)), base_dir)
    raise TypeError(f"{path}: no parser for the type {hint!r}")  # a schema bug, not bad input


def _convert_list(item: Any, value: Any, path: str, meta: Setting, base_dir: Path) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise ConfigError(path, f"expected a list of {describe_type(item, plural=True)}, got {type(value).__name__}")
    if meta.minimum is not None and len(value) < meta.minimum:
        wanted = "a non-empty list" if meta.minimum == 1 else f"at least {meta.minimum} items"
        raise ConfigError(path, f"expected {wanted} of {describe_type(item, plural=True)}")
    if meta.maximum is not None and len(value) > meta.maximum:
        raise ConfigError(path, f"expected at most {meta.maximum} items, got {len(value)}")
    if section_type(item) is not None:
        sections, failed = [], False
        for index, element in enumerate(value):
            try:
                sections.append(parse_section(item, element, join(path, index), base_dir))
            except ConfigError as exc:  # each table of the list is checked, also after a bad one
                _record(exc)
                failed = True
        if failed:
            raise SectionRejected(path, "rejected")
        return tuple(sections)
    return tuple(_list_item(item, element, path, index, base_dir) for index, element in enumerate(value))


def _list_item(item: Any, value: Any, path: str, index: int, base_dir: Path) -> Any:
    """A table in a list is a place of its own (``listeners[1].type``); a bad scalar is the list's error."""
    try:
        return _convert(item, value, join(path, index), Setting(), base_dir)
    except ConfigError as exc:
        raise ConfigError(path, f"item {index}: {exc.message}") from None


def _expect(kind: type[S], value: Any, path: str) -> S:
    if not isinstance(value, kind):
        wanted = {bool: "true or false", str: "a string"}[kind]
        raise ConfigError(path, f"expected {wanted}, got {type(value).__name__}")
    return value


def _bounded(value: float, path: str, meta: Setting) -> float:
    if meta.minimum is not None and value < meta.minimum:
        raise ConfigError(path, f"must be >= {meta.minimum}, got {value}")
    if meta.maximum is not None and value > meta.maximum:
        raise ConfigError(path, f"must be <= {meta.maximum}, got {value}")
    return value


def _resolve(file: Path, base_dir: Path) -> Path:
    return file if file.is_absolute() else base_dir / file


def section_type(hint: Any) -> type | None:
    if typing.get_origin(hint) is tuple:
        hint = typing.get_args(hint)[0]
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def describe_type(hint: Any, plural: bool = False) -> str:
    """The type as an operator reads it: "integer", "one of normal, full", "list of strings"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        (inner,) = (arg for arg in args if arg is not type(None))
        return f"{describe_type(inner, plural)} (optional)"
    if origin is Literal:
        return ", ".join(args) if plural else f"one of {', '.join(args)}"
    if origin is tuple:
        return f"list of {describe_type(args[0], plural=True)}"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return "tables" if plural else "table"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    name = names[hint]
    return f"{name}s" if plural else name
