"""Tokens of the Edge Hub route language, lexed the way its ANTLR lexer does it.

Edge Hub's lexer (``GrammarLexer.g4``) picks the *longest* match at every position and breaks ties by rule
order. That rule has visible consequences - ``-undefined`` is one property name, not a negated literal,
and ``3+4`` without spaces is an identifier - so we keep it instead of a friendlier tokenizer: a condition
that routes a message in Edge Hub must route it here too. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class RouteSyntaxError(ValueError):
    """A route or condition that does not parse or type-check; ``column`` is 1-based in the given text."""

    def __init__(self, message: str, column: int) -> None:
        super().__init__(f"column {column}: {message}")
        self.message = message
        self.column = column


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    column: int  # 1-based


_ESC = r"""\\(?:["'\\]|u[0-9a-fA-F]{4})"""
_NOT_ID = r"""()<>@,;:\\"/\[\]?={} \t\n\r"""
_NOT_PATH = r"""()<>@,;:\\"/?={} \t\n\r"""

# (kind, pattern) in the lexer's rule order: on equal lengths the earlier rule wins.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("SELECT", r"[Ss][Ee][Ll][Ee][Cc][Tt]"),
        ("FROM", r"[Ff][Rr][Oo][Mm]"),
        ("WHERE", r"[Ww][Hh][Ee][Rr][Ee]"),
        ("INTO", r"[Ii][Nn][Tt][Oo]"),
        ("STRING", rf'"(?:{_ESC}|[^"\\])*"|\'(?:{_ESC}|[^\'\\])*\''),
        ("UNTERMINATED_STRING", rf'"(?:{_ESC}|[^"\\])*|\'(?:{_ESC}|[^\'\\])*'),
        ("INTEGER", r"-?[0-9]+"),
        ("HEX", r"0[Xx][0-9a-fA-F]+"),
        ("REAL", r"-?[0-9]*\.[0-9]+(?:[Ee][+-]?[0-9]+)?|-?[0-9]*[Ee][+-]?[0-9]+"),
        ("TRUE", r"true"),
        ("FALSE", r"false"),
        ("NULL", r"null"),
        ("UNDEFINED", r"undefined"),
        ("(", r"\("),
        (")", r"\)"),
        (",", r","),
        ("+", r"\+"),
        ("-", r"-"),
        ("*", r"\*"),
        ("/", r"/"),
        ("%", r"%"),
        ("AND", r"[Aa][Nn][Dd]"),
        ("OR", r"[Oo][Rr]"),
        ("NOT", r"[Nn][Oo][Tt]"),
        ("=", r"="),
        ("!=", r"!="),
        ("<>", r"<>"),
        ("<=", r"<="),
        (">=", r">="),
        (">", r">"),
        ("<", r"<"),
        ("||", r"\|\|"),
        ("??", r"\?\?"),
        ("{", r"\{"),
        ("}", r"\}"),
        ("SYS_PROP", rf"\$[^{_NOT_PATH}]+"),
        ("ID", rf"[^{_NOT_ID}]+"),
    )
)
_WHITESPACE = re.compile(r"[ \t\r\n]+|/\*.*?\*/", re.S)


def tokenize(text: str) -> list[Token]:
    """Longest match wins, ties go to the earlier rule; an unknown character is a syntax error."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        skip = _WHITESPACE.match(text, pos)
        if skip:
            pos = skip.end()
            continue
        best: tuple[str, str] | None = None
        for kind, pattern in _RULES:
            match = pattern.match(text, pos)
            if match and match.end() > pos and (best is None or len(match.group()) > len(best[1])):
                best = (kind, match.group())
        if best is None:
            raise RouteSyntaxError(f"unrecognized character {text[pos]!r}", pos + 1)
        if best[0] == "UNTERMINATED_STRING":
            raise RouteSyntaxError("unterminated string", pos + 1)
        tokens.append(Token(best[0], best[1], pos + 1))
        pos += len(best[1])
    return tokens


def unescape(quoted: str) -> str:
    """The value of a STRING token: quotes stripped, ``\\uXXXX`` and ``\\"`` ``\\'`` ``\\\\`` resolved."""
    inner = quoted[1:-1]
    inner = re.sub(r"\\[Uu]([0-9A-Fa-f]{4})", lambda m: chr(int(m.group(1), 16)), inner)
    return re.sub(r"""\\(["'\\])""", lambda m: m.group(1), inner)
