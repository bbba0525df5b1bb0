r"""The WHERE language: a recursive-descent parser and a type-checking compiler to Python closures.

Grammar
-------
A route (``routes.parse_route``) and its condition, in ISO EBNF; the tokens are ``lexer.py``'s and the
functions ``condition_builtins.BUILTINS``. It is the grammar of Edge Hub's ``Route.g4``, the ``Condition``
grammar it imports and ``GrammarLexer.g4`` (Azure/iotedge
``edge-hub/core/src/Microsoft.Azure.Devices.Routing.Core/grammar/``)::

    route          = [ SELECT, "*" ], FROM, source, [ WHERE, condition ], INTO, sink ;
    source         = "/", item, { "/", item } ;               (* no spaces inside; item: ID or "*" *)
    item           = ID | "*" ;
    sink           = "$upstream"                              (* a SYS_PROP, any case *)
                   | "BrokeredEndpoint", "(", STRING, ")" ;   (* "/modules/{m}/inputs/{i}" *)

    condition      = [ coalesce ] ;                           (* empty: undefined, routes nothing *)
    coalesce       = or, { "??", or } ;
    or             = and, { OR, and } ;
    and            = equality, { AND, equality } ;
    equality       = comparison, { ( "=" | "!=" | "<>" ), comparison } ;
    comparison     = additive, { ( "<" | "<=" | ">" | ">=" ), additive } ;
    additive       = multiplicative, { ( "+" | "-" | "||" ), multiplicative } ;
    multiplicative = unary, { ( "*" | "/" | "%" ), unary } ;
    unary          = "-", unary | NOT, unary | primary ;
    primary        = "(", coalesce, ")"
                   | STRING | INTEGER | REAL | HEX
                   | "true" | "false" | "null" | "undefined"
                   | "{", SYS_PROP, "}"                       (* always the system property *)
                   | SYS_PROP                                 (* $x: app property $x, else system x *)
                   | ID, "(", [ coalesce, { ",", coalesce } ], ")"   (* a builtin function *)
                   | ID ;                                     (* an application property *)

    (* tokens: longest match wins, a tie goes to the rule listed first in lexer.py *)
    SELECT, FROM, WHERE, INTO, AND, OR, NOT = keyword in any case ;
    "true", "false", "null", "undefined"    = lowercase only ;
    STRING   = '"', { escape | ? any but " and \ ? }, '"' | "'", { escape | ? any but ' and \ ? }, "'" ;
    escape   = "\", ( '"' | "'" | "\" | "u", 4 * hex digit ) ;
    INTEGER  = [ "-" ], digit, { digit } ;
    HEX      = "0", ( "x" | "X" ), hex digit, { hex digit } ;
    REAL     = [ "-" ], { digit }, ".", digit, { digit }, [ exponent ] | [ "-" ], { digit }, exponent ;
    exponent = ( "e" | "E" ), [ "+" | "-" ], digit, { digit } ;
    SYS_PROP = "$", path char, { path char } ;    (* $body.a.b[0] queries a JSON body *)
    ID       = id char, { id char } ;
    path char = ? any but ( ) < > @ , ; : \ " / ? = { } and white space ? ;
    id char   = ? any path char but [ ] ? ;
    (* white space and /* comments */ separate tokens *)

In a route, ``INTO`` is the last INTO token and ``WHERE`` the first WHERE after the source: the condition
is the text between them.

Rules
-----
* Types are checked when the route is compiled, as Edge Hub does: a condition whose operand types do not
  fit (``3 + key1``: a property is a string) makes ``compile_condition`` raise ``RouteSyntaxError`` with the
  column, so a bad manifest is refused before it replaces the running routes.
* Only a final ``True`` routes the message; values and three-valued logic are ``condition_values``'.

Pure: no asyncio, sockets or sqlite3.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from appliance.forwarding.condition_builtins import BUILTINS
from appliance.forwarding.condition_values import (
    ARITHMETIC,
    NULL,
    UNDEFINED,
    Kind,
    compare,
    concat,
    finite_or_inf,
    kind_fits,
    logic_value,
    number_value,
    to_bool,
)
from appliance.forwarding.lexer import RouteSyntaxError, Token, tokenize, unescape

__all__ = ["NULL", "UNDEFINED", "DictMessage", "Kind", "MessageView", "RouteCondition", "compile_condition", "parse_json_body"]


class MessageView(Protocol):
    """What a condition may read from a message."""

    def app_property(self, name: str) -> str | None | Any: ...  # value, None for a null value, UNDEFINED
    def system_property(self, name: str) -> str | None | Any: ...
    def body_json(self) -> Any: ...  # parsed JSON body, or UNDEFINED when the body is not JSON


Eval = Callable[[MessageView], Any]


@dataclass(frozen=True, slots=True)
class Expr:
    kind: Kind
    evaluate: Eval


@dataclass(frozen=True, slots=True)
class RouteCondition:
    """A compiled WHERE clause; ``matches`` is True only when the three-valued result is true."""

    text: str
    expr: Expr

    def evaluate(self, message: MessageView) -> Any:
        """The three-valued result: True, False or UNDEFINED."""
        return to_bool(self.expr.evaluate(message))

    def matches(self, message: MessageView) -> bool:
        return self.evaluate(message) is True


# ---------------------------------------------------------------------------------------------- parser

_LOGIC_KINDS = (Kind.BOOL, Kind.NULL, Kind.UNDEFINED, Kind.DYNAMIC)
_EMPTY = Expr(Kind.UNDEFINED, lambda m: UNDEFINED)


def _json_value(value: Any) -> Any:
    """A JSON body value as a condition value: objects and arrays are not comparable, so undefined."""
    if value is None:
        return NULL
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return number_value(float(value))
    return UNDEFINED


_BODY_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _body_query(path: str, column: int) -> Eval:
    steps: list[str | int] = []
    for part in path.split("."):
        matched = 0
        for match in _BODY_STEP.finditer(part):
            steps.append(match.group(1) if match.group(1) is not None else int(match.group(2)))
            matched += len(match.group())
        if not part or matched != len(part):
            raise RouteSyntaxError(f"invalid body query '$body.{path}'", column)

    def evaluate(message: MessageView) -> Any:
        node = message.body_json()
        for step in steps:
            if isinstance(step, int) and isinstance(node, list) and step < len(node):
                node = node[step]
            elif isinstance(step, str) and isinstance(node, dict) and step in node:
                node = node[step]
            else:
                return UNDEFINED
        return _json_value(node)

    return evaluate


def _property_value(value: Any) -> Any:
    return NULL if value is None else value


class _Parser:
    """Precedence, loosest first: ``??``, OR, AND, equality, comparison, ``+ - ||``, ``* / %``, unary."""

    def __init__(self, text: str, column_offset: int) -> None:
        self.text = text
        self.offset = column_offset
        self.tokens = tokenize(text)
        self.pos = 0

    def error(self, message: str, column: int) -> RouteSyntaxError:
        return RouteSyntaxError(message, column + self.offset)

    def peek(self) -> Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, *kinds: str) -> Token | None:
        token = self.peek()
        if token is not None and token.kind in kinds:
            self.pos += 1
            return token
        return None

    def expect(self, kind: str, what: str) -> Token:
        token = self.take(kind)
        if token is None:
            found = self.peek()
            column = found.column if found else len(self.text) + 1
            raise self.error(f"expected {what}, found {found.text!r}" if found else f"expected {what} at end", column)
        return token

    def parse(self) -> Expr:
        if not self.tokens:
            return _EMPTY
        expr = self.coalesce()
        extra = self.peek()
        if extra is not None:
            message = "unmatched closing ')'" if extra.kind == ")" else f"unexpected {extra.text!r}"
            raise self.error(message, extra.column)
        return expr

    def binary(self, next_level: Callable[[], Expr], ops: Sequence[str], build: Callable[[Token, Expr, Expr], Expr]) -> Expr:
        left = next_level()
        while (op := self.take(*ops)) is not None:
            left = build(op, left, next_level())
        return left

    def coalesce(self) -> Expr:
        return self.binary(self.or_, ("??",), self.build_coalesce)

    def or_(self) -> Expr:
        return self.binary(self.and_, ("OR",), self.build_logic)

    def and_(self) -> Expr:
        return self.binary(self.equality, ("AND",), self.build_logic)

    def equality(self) -> Expr:
        return self.binary(self.comparison, ("=", "!=", "<>"), self.build_compare)

    def comparison(self) -> Expr:
        return self.binary(self.additive, ("<", "<=", ">", ">="), self.build_compare)

    def additive(self) -> Expr:
        return self.binary(self.multiplicative, ("+", "-", "||"), self.build_arithmetic)

    def multiplicative(self) -> Expr:
        return self.binary(self.unary, ("*", "/", "%"), self.build_arithmetic)

    def unary(self) -> Expr:
        if (op := self.take("-")) is not None:
            operand = self.unary()
            self.check_operands(op, Kind.NUMBER, operand)
            inner = operand.evaluate
            return Expr(Kind.NUMBER, lambda m: UNDEFINED if (v := number_value(inner(m))) is UNDEFINED else -v)
        if (op := self.take("NOT")) is not None:
            operand = self.unary()
            if operand.kind not in _LOGIC_KINDS:
                raise self.error(f"operator NOT needs a bool, got {operand.kind.value}", op.column)
            inner = operand.evaluate

            def negate(m: MessageView) -> Any:
                value = logic_value(inner(m))
                return UNDEFINED if value is UNDEFINED else not value

            return Expr(Kind.BOOL, negate)
        return self.primary()

    def primary(self) -> Expr:
        token = self.peek()
        if token is None:
            raise self.error("expected an expression at end", len(self.text) + 1)
        self.pos += 1
        kind = token.kind
        if kind == "(":
            inner = self.coalesce()
            if self.take(")") is None:
                raise self.error("missing closing ')'", token.column)
            return inner
        if kind == "STRING":
            value = unescape(token.text)
            return Expr(Kind.STRING, lambda m: value)
        if kind in ("INTEGER", "REAL"):
            number = finite_or_inf(lambda: float(token.text))
            return Expr(Kind.NUMBER, lambda m: number)
        if kind == "HEX":
            hexvalue = float(int(token.text[2:], 16))
            return Expr(Kind.NUMBER, lambda m: hexvalue)
        if kind in ("TRUE", "FALSE"):
            flag = kind == "TRUE"
            return Expr(Kind.BOOL, lambda m: flag)
        if kind == "NULL":
            return Expr(Kind.NULL, lambda m: NULL)
        if kind == "UNDEFINED":
            return _EMPTY
        if kind == "{":
            prop = self.expect("SYS_PROP", "a $property after '{'")
            self.expect("}", "'}'")
            return self.system_property(prop, escaped=True)
        if kind == "SYS_PROP":
            return self.system_property(token, escaped=False)
        if kind == "ID":
            if self.take("(") is not None:
                return self.call(token)
            name = token.text
            return Expr(Kind.STRING, lambda m: _property_value(m.app_property(name)))
        if kind == ")":
            raise self.error("unmatched closing ')'", token.column)
        raise self.error(f"unexpected {token.text!r}", token.column)

    def system_property(self, token: Token, escaped: bool) -> Expr:
        """``$x`` is the application property ``$x`` if the message has one, else system property ``x``;
        ``{$x}`` is always the system property; ``$body.path`` queries a JSON body."""
        name = token.text
        if name.lower().startswith("$body."):
            query = _body_query(name[6:], token.column + self.offset)
            if escaped:
                return Expr(Kind.DYNAMIC, query)

            def app_or_body(m: MessageView) -> Any:
                value = m.app_property(name)
                return query(m) if value is UNDEFINED else _property_value(value)

            return Expr(Kind.DYNAMIC, app_or_body)
        if "[" in name or "]" in name:
            return _EMPTY
        system = name[1:]
        if escaped:
            return Expr(Kind.STRING, lambda m: _property_value(m.system_property(system)))

        def app_or_system(m: MessageView) -> Any:
            value = m.app_property(name)
            return _property_value(m.system_property(system) if value is UNDEFINED else value)

        return Expr(Kind.STRING, app_or_system)

    def call(self, name: Token) -> Expr:
        args: list[Expr] = []
        if self.take(")") is None:
            args.append(self.coalesce())
            while self.take(",") is not None:
                args.append(self.coalesce())
            if self.take(")") is None:
                found = self.peek()
                raise self.error("missing closing ')'", found.column if found else len(self.text) + 1)
        builtin = BUILTINS.get(name.text.lower())
        if builtin is None:
            raise self.error(f"unknown function {name.text!r}", name.column)
        kinds = [a.kind for a in args]
        if builtin.variadic is not None:
            valid = len(args) >= 2 and all(kind_fits(builtin.variadic, k) for k in kinds)
        else:
            valid = any(len(o) == len(kinds) and all(kind_fits(r, k) for r, k in zip(o, kinds, strict=True)) for o in builtin.overloads)
        if not valid:
            given = ", ".join(k.value for k in kinds)
            raise self.error(f"no overload of {name.text.lower()}({given})", name.column)
        evaluators = [a.evaluate for a in args]
        run = builtin.run
        return Expr(builtin.result, lambda m: run(*[e(m) for e in evaluators]))

    # -- builders: each checks operand kinds the way Edge Hub's ConditionVisitor does

    def check_operands(self, op: Token, required: Kind, *operands: Expr) -> None:
        if not all(kind_fits(required, o.kind) for o in operands):
            given = ", ".join(o.kind.value for o in operands)
            raise self.error(f"operator {op.text!r} needs {required.value} operands, got {given}", op.column)

    def build_arithmetic(self, op: Token, left: Expr, right: Expr) -> Expr:
        lhs, rhs = left.evaluate, right.evaluate
        if op.kind == "||":
            self.check_operands(op, Kind.STRING, left, right)
            return Expr(Kind.STRING, lambda m: concat(lhs(m), rhs(m)))
        self.check_operands(op, Kind.NUMBER, left, right)
        fn = ARITHMETIC[op.kind]

        def arithmetic(m: MessageView) -> Any:
            a, b = number_value(lhs(m)), number_value(rhs(m))
            return UNDEFINED if a is UNDEFINED or b is UNDEFINED else fn(a, b)

        return Expr(Kind.NUMBER, arithmetic)

    def build_compare(self, op: Token, left: Expr, right: Expr) -> Expr:
        if not (left.kind is right.kind or Kind.DYNAMIC in (left.kind, right.kind)):
            raise self.error(f"operator {op.text!r} compares {left.kind.value} with {right.kind.value}", op.column)
        lhs, rhs, kind = left.evaluate, right.evaluate, op.kind
        return Expr(Kind.BOOL, lambda m: compare(kind, lhs(m), rhs(m)))

    def build_logic(self, op: Token, left: Expr, right: Expr) -> Expr:
        if left.kind not in _LOGIC_KINDS or right.kind not in _LOGIC_KINDS:
            raise self.error(f"operator {op.text.upper()} needs bool operands, got {left.kind.value}, {right.kind.value}", op.column)
        lhs, rhs = left.evaluate, right.evaluate
        if op.kind == "AND":
            if Kind.NULL in (left.kind, right.kind):
                return Expr(Kind.NULL, lambda m: NULL)

            def conj(m: MessageView) -> Any:
                a = logic_value(lhs(m))
                if a is False:
                    return False
                b = logic_value(rhs(m))
                if b is False:
                    return False
                return True if a is True and b is True else UNDEFINED

            return Expr(Kind.BOOL, conj)
        if left.kind is Kind.NULL and right.kind is Kind.NULL:
            return Expr(Kind.NULL, lambda m: NULL)

        def disj(m: MessageView) -> Any:
            a = logic_value(lhs(m))
            if a is True:
                return True
            b = logic_value(rhs(m))
            if b is True:
                return True
            return False if a is False and b is False else UNDEFINED

        return Expr(Kind.BOOL, disj)

    def build_coalesce(self, op: Token, left: Expr, right: Expr) -> Expr:
        if not (left.kind is right.kind or Kind.DYNAMIC in (left.kind, right.kind)):
            raise self.error(f"operator '??' needs operands of one type, got {left.kind.value}, {right.kind.value}", op.column)
        if left.kind is Kind.UNDEFINED:
            return right
        lhs, rhs = left.evaluate, right.evaluate
        return Expr(right.kind if left.kind is Kind.DYNAMIC else left.kind, lambda m: v if (v := lhs(m)) is not UNDEFINED else rhs(m))


def compile_condition(text: str, column_offset: int = 0) -> RouteCondition:
    """Parse and type-check ``text``; errors carry the column (shifted by ``column_offset``)."""
    return RouteCondition(text, _Parser(text, column_offset).parse())


@dataclass(slots=True)
class DictMessage:
    """A ``MessageView`` over plain dicts, for ``routes check`` and tests."""

    properties: Mapping[str, str | None]
    system: Mapping[str, str | None]
    body: bytes = b""
    content_type: str | None = None
    source: str = "/messages/events"

    def app_property(self, name: str) -> Any:
        return _lookup(self.properties, name)

    def system_property(self, name: str) -> Any:
        return _lookup(self.system, name)

    def body_json(self) -> Any:
        return parse_json_body(self.body, self.content_type)


def _lookup(values: Mapping[str, str | None], name: str) -> Any:
    if name in values:
        return values[name]
    lowered = name.lower()
    for key, value in values.items():
        if key.lower() == lowered:
            return value
    return UNDEFINED


def parse_json_body(body: bytes, content_type: str | None) -> Any:
    """The body as JSON when the content type says JSON (as IoT Hub requires), else UNDEFINED."""
    if content_type is None or "json" not in content_type.lower():
        return UNDEFINED
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return UNDEFINED
