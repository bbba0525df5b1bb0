"""A class name says which one: no two classes in ``appliance/`` share a name (issue 27, item 6).

Two ``Notification`` classes, or a ``Condition`` that is a route's WHERE clause in one package and a SET
option in another, make a reader (and an import) guess which is meant."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Names whose second copy is inside ``appliance/broker``, renamed there on the broker branch (issue 27,
#: item 6): tolerated only while a copy is in the broker; delete an entry once the name is unique.
BROKER_RENAMES_PENDING = {"AclRule", "Message", "ProtocolError"}


def class_definitions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "appliance").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_class_name_is_defined_twice() -> None:
    twice = {name: places for name, places in class_definitions().items() if len(places) > 1}
    unexplained = {
        name: places
        for name, places in twice.items()
        if name not in BROKER_RENAMES_PENDING or not any(place.startswith("appliance/broker/") for place in places)
    }
    assert unexplained == {}


def test_every_pending_broker_rename_is_still_a_duplicate() -> None:
    """Once the broker's copy is renamed, its entry must go, so the list cannot hide a new duplicate."""
    definitions = class_definitions()
    assert {name for name in BROKER_RENAMES_PENDING if len(definitions[name]) < 2} == set()
