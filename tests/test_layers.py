"""Imports point down between the top-level folders: the gateway imports no test code, and what the
suite, the benchmarks and the HIL bench share lives in ``testing/``, which imports none of them.

A helper that ``hil_tests/`` or ``bench/`` takes from ``tests/`` makes the suite a library of the bench;
such a helper belongs in ``testing/``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Folder -> the top-level packages it may not import.
FORBIDDEN = {
    "appliance": {"testing", "tests", "hil_tests", "bench", "pipeline"},
    "testing": {"tests", "hil_tests", "bench", "pipeline"},
    "hil_tests": {"tests", "bench"},
    "bench": {"tests"},
}


def top_level_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import, anywhere in the module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_folder_imports_from_a_layer_above_it(folder: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {package}"
        for path in sorted((ROOT / folder).rglob("*.py")) if "build" not in path.relative_to(ROOT).parts
        for line, package in top_level_imports(ast.parse(path.read_text(), str(path)))
        if package in FORBIDDEN[folder]
    ]
    assert offenders == []


def test_the_scan_sees_imports_inside_functions() -> None:
    tree = ast.parse("def f():\n    from tests.forwarding.peers import Device\n    import bench.forward\n")
    assert top_level_imports(tree) == [(2, "tests"), (3, "bench")]
