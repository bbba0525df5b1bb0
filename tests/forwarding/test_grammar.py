"""The route grammar as written (EBNF in ``conditions.py``, builtins in ``docs/forwarding.md``) against the
lexer and the function table that implement it: a token or function added to one and not the other fails."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from appliance.forwarding import conditions, lexer
from appliance.forwarding.condition_builtins import BUILTINS

ROOT = Path(__file__).resolve().parents[2]


def grammar_text() -> str:
    doc = conditions.__doc__ or ""
    return doc[doc.index("Grammar\n") : doc.index("Rules\n")]


def test_every_token_of_the_lexer_is_in_the_grammar() -> None:
    grammar = grammar_text()
    named = set(re.findall(r"\b[A-Z_]{2,}\b", grammar))
    quoted = set(re.findall(r'"([^"\s]+)"', grammar))
    missing = [
        kind
        for kind, _ in lexer._RULES
        if kind != "UNTERMINATED_STRING" and kind not in named and kind not in quoted and kind.lower() not in quoted
    ]
    assert missing == []


def test_the_builtins_listed_in_the_docs_are_the_ones_implemented() -> None:
    text = (ROOT / "docs/forwarding.md").read_text()
    listed = re.search(r"Built-ins \(case-insensitive\): `([^`]+)`", text)
    assert listed is not None
    assert sorted(listed.group(1).split()) == sorted(BUILTINS)


ROUTE_LANGUAGE = ("lexer", "condition_values", "condition_builtins", "conditions", "routes")
IO = {"asyncio", "time", "socket", "ssl", "selectors", "threading", "sqlite3", "concurrent", "uvloop"}


def test_the_route_language_imports_no_io() -> None:
    """Pure, as Edge Hub's evaluator: the modules import no I/O, and of ours only each other (and validity)."""
    allowed_own = {f"appliance.forwarding.{name}" for name in (*ROUTE_LANGUAGE, "validity")}
    for name in ROUTE_LANGUAGE:
        tree = ast.parse((ROOT / f"appliance/forwarding/{name}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not {module.split(".")[0] for module in imported} & IO, name
        assert {module for module in imported if module.startswith("appliance")} <= allowed_own, name
