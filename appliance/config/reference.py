"""The settings reference, generated from the schema's fields, so the documentation cannot drift from the
parser: ``appliance check-config --schema`` prints it and docs/configuration.md holds it (checked by
tests/config/test_reference.py)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from appliance.config.schema import (
    SETTING,
    Setting,
    describe_type,
    field_types,
    join,
    section_type,
)


@dataclass(frozen=True, slots=True)
class SettingDoc:
    """One row of the settings reference."""

    key: str
    type: str
    default: str
    bounds: str
    doc: str


def settings(cls: type, path: str = "") -> Iterator[SettingDoc]:
    """Every setting under ``cls``, depth first; a list of tables shows its items as ``key[].field``."""
    types_of = field_types(cls)
    for field in dataclasses.fields(cls):
        hint, key = types_of[field.name], join(path, field.name)
        meta = field.metadata.get(SETTING, Setting())
        section = section_type(hint)
        if section is not None and typing.get_origin(hint) is tuple:
            yield SettingDoc(key, "list of tables", _shown_default(field, meta), _shown_bounds(hint, meta), meta.doc)
            yield from settings(section, f"{key}[]")
        elif section is not None:
            yield from settings(section, key)
        else:
            yield SettingDoc(key, describe_type(hint), _shown_default(field, meta), _shown_bounds(hint, meta), meta.doc)


def reference_table(cls: type) -> str:
    """The settings under ``cls`` as a Markdown table (docs/configuration.md, ``check-config --schema``)."""
    lines = ["| key | type | default | bounds | what |", "|---|---|---|---|---|"]
    for row in settings(cls):
        cells = (f"`{row.key}`", row.type, f"`{row.default}`" if row.default.startswith(('"', "[")) else row.default, row.bounds, row.doc)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"




def _shown_default(field: dataclasses.Field[Any], meta: Setting) -> str:
    if meta.shown_default is not None:
        return meta.shown_default
    if field.default is not MISSING:
        return toml_value(field.default)
    if field.default_factory is not MISSING:
        return toml_value(field.default_factory())
    return "required"


def toml_value(value: Any) -> str:
    """A default as it would be written in the file; ``None`` is an absent key."""
    if value is None:
        return "absent"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, Path):
        return f'"{value}"'
    if isinstance(value, tuple):
        if value and dataclasses.is_dataclass(value[0]):
            return f"{len(value)} table{'s' if len(value) != 1 else ''}"
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return str(value)


def _shown_bounds(hint: Any, meta: Setting) -> str:
    if meta.minimum is None and meta.maximum is None:
        return ""
    unit = " items" if typing.get_origin(hint) is tuple else ""
    if unit and meta.minimum == 1 and meta.maximum is None:
        return "non-empty"
    if meta.maximum is None:
        return f">= {meta.minimum}{unit}"
    if meta.minimum is None:
        return f"<= {meta.maximum}{unit}"
    return f"{meta.minimum} - {meta.maximum}{unit}"
