"""A class name says which one: no two classes in ``appliance/`` and ``pipeline/`` share a name.

Two ``Notification`` classes, or a ``Condition`` that is a route's WHERE clause in one package and a SET
option in another, make a reader (and an import) guess which is meant."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def class_definitions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(p for folder in ("appliance", "pipeline") for p in (ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_class_name_is_defined_twice() -> None:
    twice = {name: places for name, places in class_definitions().items() if len(places) > 1}
    assert twice == {}
