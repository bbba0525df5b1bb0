"""Imports inside ``appliance.broker`` point one way: no cycle, counting every import.

``test_imports.py`` follows the imports that run; this one counts the ones that do not too: an import
under ``if TYPE_CHECKING:``, inside a function, or of a name used only in an annotation. Such an import is
still a dependency a reader follows (and mypy loads), and a cycle through it is how a handler came to
know the whole ``Broker``. Packages' ``__init__`` modules count as modules of their own. The same holds for
the whole gateway: a cycle that leaves the broker and comes back (or one between two services) counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import appliance

ROOT = Path(appliance.__file__).parent
PACKAGE = "appliance.broker"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in ROOT.rglob("*.py")}


def imported_by(module: str) -> set[str]:
    """The modules of ``appliance`` that ``module`` imports anywhere in its text (a relative import
    is resolved against ``module``'s package)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in MODULES and name != module)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_inside_the_broker_even_counting_annotation_imports() -> None:
    broker = {module for module in MODULES if module == PACKAGE or module.startswith(PACKAGE + ".")}
    assert len(broker) > 40
    graph = {module: imported_by(module) & broker for module in broker}
    assert cycles(graph) == []


def test_no_import_cycle_in_the_gateway_even_counting_annotation_imports() -> None:
    graph = {module: imported_by(module) for module in MODULES}
    assert cycles(graph) == []


def test_the_scan_counts_type_checking_imports_and_finds_a_cycle() -> None:
    # storage names the handler context only in annotations, under TYPE_CHECKING or not: still an edge.
    assert "appliance.broker.context" in imported_by("appliance.broker.persistence.storage")
    assert "appliance.broker.codec.packets" in imported_by("appliance.broker.codec.reasons")  # TYPE_CHECKING
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
