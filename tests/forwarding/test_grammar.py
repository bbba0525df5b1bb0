"""The route grammar as written (EBNF in ``conditions.py``, builtins in ``docs/forwarding.md``) against the
lexer and the function table that implement it: a token or function added to one and not the other fails."""

from __future__ import annotations

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
