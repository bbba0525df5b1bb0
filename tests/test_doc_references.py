"""Every file and module a docstring, a comment or a document names exists: a path that moved or a test
that was renamed leaves a reference a reader follows into nothing (a stale reference is a defect)."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVELS = ("appliance", "tests", "docs", "bench", "pipeline", "testing", "hil_tests", "device_firmware", "systemd", "images", "ops")
#: A repository path such as ``tests/broker/test_timing.py`` or ``docs/broker.md`` (not ``a/tests/x.py``).
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP_LEVELS)})/[\w./-]*\w\.(?:py|md|toml|json|sh|service))(?![\w/])")
#: A dotted module name such as ``appliance.broker.routing.router`` (optionally with one attribute).
DOTTED = re.compile(r"(?<![\w./])(appliance(?:\.\w+)+)")
#: A relative Markdown link such as ``[security](broker-security.md#limits)``.
LINK = re.compile(r"\]\(([^)#:\s]+\.md)(?:#[^)]*)?\)")
#: Folders that are not the repository's own text: environments, caches, build output and run artifacts.
SKIP = {".venv", ".git", ".hypothesis", ".pytest_cache", "node_modules", "__pycache__", "build", "dist", "artifacts"}


@functools.cache
def sources() -> list[Path]:
    folders = ("appliance", "pipeline", "testing", "bench", "hil_tests", "tests", "device_firmware", "images", "ops")
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py")) if not SKIP & set(p.parts)]


def documents() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.md")) if not SKIP & set(p.relative_to(ROOT).parts)]


@functools.cache
def definitions(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A Python file's docstrings and the names of its functions and classes, from one walk of its tree
    (walking every file's tree was most of this module's time)."""
    docstrings, names = [], []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstrings.append(ast.get_docstring(node, clean=False) or "")
            if not isinstance(node, ast.Module):
                names.append(node.name)
    return tuple(docstrings), tuple(names)


@functools.cache
def prose(path: Path) -> tuple[str, ...]:
    """A Python file's docstrings and comments: where a reader is told to look elsewhere."""
    comments = [line[line.index("#") :] for line in path.read_text().splitlines() if "#" in line]
    return (*definitions(path)[0], *comments)


def module_exists(name: str) -> bool:
    """``a.b.c`` names a module, a package, or one attribute of a module (``appliance.gateway.serve``)."""
    parts = name.split(".")
    for length in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:length])
        if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
            return length >= len(parts) - 1
    return False


def named_in_prose(path: Path, pattern: re.Pattern[str], exists: Callable[[str], bool]) -> list[str]:
    """What ``pattern`` finds in ``path``'s docstrings and comments that does not exist. The whole text is
    searched first (fast); only a file with a miss is parsed, to leave out string literals in code."""
    misses = {named for named in pattern.findall(path.read_text()) if not exists(named)}
    if not misses:
        return []
    return sorted({named for text in prose(path) for named in pattern.findall(text) if named in misses})


def test_paths_named_in_docstrings_and_comments_exist() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: {named}"
        for path in sources()
        for named in named_in_prose(path, PATH, lambda named: (ROOT / named).exists())
    ]
    assert missing == []


def test_modules_named_in_docstrings_comments_and_documents_exist() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: {named}"
        for path in sources()
        for named in named_in_prose(path, DOTTED, lambda named: module_exists(named.rstrip(".")))
    ]
    missing += sorted(
        f"{path.relative_to(ROOT)}: {named}"
        for path in documents()
        for named in DOTTED.findall(path.read_text())
        if not module_exists(named.rstrip("."))
    )
    assert missing == []


def test_paths_and_links_in_documents_exist() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}: {named}"
        for path in documents()
        for named in PATH.findall(path.read_text())
        if not (ROOT / named).exists()
    )
    missing += sorted(
        f"{path.relative_to(ROOT)}: {link}"
        for path in documents()
        for link in LINK.findall(path.read_text())
        if not (path.parent / link).exists()
    )
    assert missing == []


#: Python files a document names that the repository does not hold: written by a build step.
GENERATED = {
    "boot.py": "written onto the board by images/firmware/deploy.py (docs/firmware.md)",
    "run_pipeline.py": "written into dist/ by the pipeline build (docs/pipeline.md)",
    "dist/run_pipeline.py": "written into dist/ by the pipeline build (docs/pipeline.md)",
}


#: A Python file named anywhere in a document's text, a diagram's code block too (not inside a URL).
PY_FILE = re.compile(r"(?<![\w/.:<>-])((?:\.\./)?[\w/.-]*\w\.py)\b")


def test_python_files_named_in_documents_exist_somewhere_in_the_tree() -> None:
    """A layout table or diagram names files relative to its package (``routing/router.py`` in
    docs/broker.md): each must be the end of some path in the tree, so a module that moved is caught
    there too. (Run logs such as bench/RESULTS*.md name the scratch scripts of a measurement, which are
    not kept: not checked.)"""
    tree = {p.relative_to(ROOT).as_posix() for p in sources()}
    missing = sorted(
        f"{path.relative_to(ROOT)}: {named}"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for named in set(PY_FILE.findall(path.read_text()))
        if named not in GENERATED
        and not any(known == named.removeprefix("../") or known.endswith("/" + named.removeprefix("../")) for known in tree)
    )
    assert missing == []


#: A test named in prose: ``test_expiry_notifies_delete_at_the_deadline``, or a prefix of one written
#: ``test_the_sweep_...`` (a table cell too narrow for the whole name).
TEST_NAME = re.compile(r"(?<![\w/])(test_\w+)(\.\.\.)?")


@functools.cache
def defined_tests() -> frozenset[str]:
    """Every test module's name and every function and class defined in the tree's Python files."""
    names = {path.stem for path in sources()}
    for path in sources():
        names.update(definitions(path)[1])
    return frozenset(names)


def names_a_test(named: str, prefix: bool) -> bool:
    names = defined_tests()
    if named in names:
        return True
    return (prefix or named.endswith("_")) and any(name.startswith(named) for name in names)


def test_tests_named_in_docstrings_comments_and_documents_exist() -> None:
    """A docstring that names a test sends the reader to it: the test must still be there."""
    texts = [(path, text) for path in sources() for text in prose(path) if "test_" in text]
    texts += [(path, path.read_text()) for path in documents()]
    missing = sorted({
        f"{path.relative_to(ROOT)}: {named}"
        for path, text in texts
        for named, ellipsis in TEST_NAME.findall(text)
        if not names_a_test(named, bool(ellipsis))
    })
    assert missing == []
