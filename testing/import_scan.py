"""What a module imports when it runs, read from its source: for tests that hold layers to their rules
(the broker's sans-I/O cores, the upstream bridge's policy over its mechanism).

Rules
-----
* An import under ``if TYPE_CHECKING:`` does not count: it never runs.
* ``from appliance.broker.sessions import lifecycle`` counts ``appliance.broker.sessions.lifecycle``: a module of the
  package named in a from-import is imported too.
* ``reached`` follows our own modules (``appliance.*``) transitively, so an I/O module cannot sneak in
  through a helper; third-party and standard modules are leaves.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path


@functools.cache  # every parametrized case follows the same modules: each is read once per process
def runtime_imports(module: str) -> frozenset[str]:
    """The dotted names of the modules ``module`` imports when it runs (not under TYPE_CHECKING)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module.startswith("appliance") and is_package(node.module):
                # ``from appliance.broker.sessions import lifecycle`` imports a module
                found.update(f"{node.module}.{alias.name}" for alias in node.names
                             if importlib.util.find_spec(f"{node.module}.{alias.name}") is not None)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return frozenset(found)


def is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def reached(module: str) -> dict[str, str]:
    """Every module reachable from ``module`` through our own imports -> the module that imports it."""
    seen: dict[str, str] = {module: ""}
    todo = [module]
    while todo:
        current = todo.pop()
        for name in runtime_imports(current):
            if name not in seen:
                seen[name] = current
                if name.startswith("appliance.") and not is_package(name):
                    todo.append(name)
    return seen
