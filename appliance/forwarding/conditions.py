"""The WHERE language: a recursive-descent parser and a type-checking compiler to Python closures.

Edge Hub compiles a condition into a typed expression tree, and a condition whose operand types do not
fit (``3 + key1``: a property is a string) is rejected when the route is loaded, not when a message
arrives. We keep that: ``compile_condition`` either returns a ``Condition`` or raises ``RouteSyntaxError``
with the column, so a bad manifest is refused before it replaces the running routes.

Values at run time: ``True``/``False``, floats, strings, ``NULL`` and ``UNDEFINED``. Logic is three-valued
(``Bool.cs``): ``UNDEFINED and false`` is false, ``UNDEFINED or true`` is true, anything else with
``UNDEFINED`` stays undefined, and only a final ``True`` routes the message. A NaN is undefined.
Pure: no asyncio, sockets or sqlite3.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from appliance.forwarding.lexer import RouteSyntaxError, Token, tokenize, unescape


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNDEFINED: Any = _Sentinel("UNDEFINED")
NULL: Any = _Sentinel("NULL")


class Kind(enum.Enum):
    """Static type of an expression; DYNAMIC is a ``$body`` query whose type is known only per message."""

    BOOL = "bool"
    NUMBER = "number"
    STRING = "string"
    NULL = "null"
    UNDEFINED = "undefined"
    DYNAMIC = "dynamic"


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
class Condition:
    """A compiled WHERE clause; ``matches`` is True only when the three-valued result is true."""

    text: str
    expr: Expr

    def evaluate(self, message: MessageView) -> Any:
        """The three-valued result: True, False or UNDEFINED."""
        return to_bool(self.expr.evaluate(message))

    def matches(self, message: MessageView) -> bool:
        return self.evaluate(message) is True


# ----------------------------------------------------------------------------------------------- values


def to_bool(value: Any) -> Any:
    """A condition's final value as three-valued logic: null is false, a number or string undefined."""
    if value is True or value is False:
        return value
    if value is NULL:
        return False
    return UNDEFINED


def _logic(value: Any) -> Any:
    """An ``and``/``or`` operand: null counts as false there (``null or false`` is false)."""
    if value is NULL:
        return False
    return value if value is True or value is False else UNDEFINED


def _number(value: Any) -> Any:
    if isinstance(value, float) and not isinstance(value, bool):
        return UNDEFINED if math.isnan(value) else value
    return UNDEFINED


def _string(value: Any) -> Any:
    return value if isinstance(value, str) else UNDEFINED


def _finite_or_inf(op: Callable[[], float]) -> Any:
    """Run a float operation the way .NET doubles behave: overflow is infinity, a domain error NaN."""
    try:
        result = op()
    except OverflowError:
        return math.inf
    except (ValueError, ZeroDivisionError):
        return UNDEFINED
    return UNDEFINED if math.isnan(result) else float(result)


def _divide(a: float, b: float) -> Any:
    if b == 0:
        return UNDEFINED if a == 0 else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return _finite_or_inf(lambda: a / b)


def _modulo(a: float, b: float) -> Any:
    return _finite_or_inf(lambda: math.fmod(a, b))


_ARITHMETIC: dict[str, Callable[[float, float], Any]] = {
    "+": lambda a, b: _finite_or_inf(lambda: a + b),
    "-": lambda a, b: _finite_or_inf(lambda: a - b),
    "*": lambda a, b: _finite_or_inf(lambda: a * b),
    "/": _divide,
    "%": _modulo,
}

_ORDER: dict[str, Callable[[int], bool]] = {
    "=": lambda c: c == 0,
    "!=": lambda c: c != 0,
    "<>": lambda c: c != 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
}


def compare(op: str, left: Any, right: Any) -> Any:
    """Edge Hub's ``ComparisonOperators``: undefined on either side is undefined; types must agree."""
    if left is UNDEFINED or right is UNDEFINED:
        return UNDEFINED
    if left is NULL or right is NULL:
        if op in ("=", "!=", "<>"):
            return _ORDER[op](0 if left is right else 1)
        return UNDEFINED
    if isinstance(left, bool) and isinstance(right, bool):
        return _ORDER[op]((left > right) - (left < right))
    if isinstance(left, float) and isinstance(right, float):
        return _ORDER[op]((left > right) - (left < right))
    if isinstance(left, str) and isinstance(right, str):
        return _ORDER[op]((left > right) - (left < right))
    return UNDEFINED


# --------------------------------------------------------------------------------------------- builtins


@dataclass(frozen=True, slots=True)
class Builtin:
    """A function: accepted argument kinds per overload (``None`` = any kind), its result kind and code."""

    overloads: tuple[tuple[Kind | None, ...], ...]
    result: Kind
    run: Callable[..., Any]
    variadic: Kind | None = None  # concat: two or more of this kind


def _num1(fn: Callable[[float], float]) -> Builtin:
    return Builtin(((Kind.NUMBER,),), Kind.NUMBER, lambda x: UNDEFINED if _number(x) is UNDEFINED else _finite_or_inf(lambda: fn(x)))


def _inf_safe(fn: Callable[[float], float]) -> Callable[[float], float]:
    return lambda x: x if math.isinf(x) else fn(x)


_NUMBER_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")


def _as_number(value: Any) -> Any:
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str) and _NUMBER_TEXT.fullmatch(value):
        return float(value)
    return UNDEFINED


def _str2(fn: Callable[[str, str], Any]) -> Builtin:
    def run(a: Any, b: Any) -> Any:
        if not isinstance(a, str) or not isinstance(b, str):
            return UNDEFINED
        return fn(a, b)

    return Builtin(((Kind.STRING, Kind.STRING),), Kind.BOOL, run)


def _str1(fn: Callable[[str], Any], result: Kind) -> Builtin:
    return Builtin(((Kind.STRING,),), result, lambda s: fn(s) if isinstance(s, str) else UNDEFINED)


def _concat(*parts: Any) -> Any:
    if any(p is UNDEFINED or not (isinstance(p, str) or p is NULL) for p in parts):
        return UNDEFINED
    return "".join("" if p is NULL else p for p in parts)


def _index(value: Any) -> int | None:
    number = _number(value)
    if number is UNDEFINED or math.isinf(number) or number < 0:
        return None
    return int(number)


def _substring(s: Any, start: Any, length: Any = None) -> Any:
    if not isinstance(s, str):
        return UNDEFINED
    begin = _index(start)
    if begin is None or begin > len(s):
        return UNDEFINED
    if length is None:
        return s[begin:]
    count = _index(length)
    if count is None or begin + count > len(s):
        return UNDEFINED
    return s[begin : begin + count]


def _index_of(s: Any, sub: Any) -> Any:
    if not isinstance(s, str) or not isinstance(sub, str):
        return UNDEFINED
    return float(s.find(sub))


BUILTINS: dict[str, Builtin] = {
    # math
    "abs": _num1(abs),
    "exp": _num1(math.exp),
    "power": Builtin(
        ((Kind.NUMBER, Kind.NUMBER),),
        Kind.NUMBER,
        lambda a, b: UNDEFINED if _number(a) is UNDEFINED or _number(b) is UNDEFINED else _finite_or_inf(lambda: math.pow(a, b)),
    ),
    "square": _num1(lambda x: x * x),
    "ceiling": _num1(_inf_safe(lambda x: float(math.ceil(x)))),
    "floor": _num1(_inf_safe(lambda x: float(math.floor(x)))),
    "sign": _num1(lambda x: float((x > 0) - (x < 0))),
    "sqrt": _num1(math.sqrt),
    # type checking
    "as_number": Builtin(((Kind.STRING,), (Kind.NUMBER,)), Kind.NUMBER, _as_number),
    "is_bool": Builtin(((None,),), Kind.BOOL, lambda v: isinstance(v, bool)),
    "is_defined": Builtin(((None,),), Kind.BOOL, lambda v: v is not UNDEFINED),
    "is_null": Builtin(((None,),), Kind.BOOL, lambda v: v is NULL),
    "is_number": Builtin(((None,),), Kind.BOOL, lambda v: isinstance(v, float) and math.isfinite(v)),
    "is_string": Builtin(((None,),), Kind.BOOL, lambda v: isinstance(v, str)),
    # strings
    "concat": Builtin((), Kind.STRING, _concat, variadic=Kind.STRING),
    "length": _str1(lambda s: float(len(s)), Kind.NUMBER),
    "lower": _str1(str.lower, Kind.STRING),
    "upper": _str1(str.upper, Kind.STRING),
    "substring": Builtin(
        ((Kind.STRING, Kind.NUMBER), (Kind.STRING, Kind.NUMBER, Kind.NUMBER)), Kind.STRING, _substring
    ),
    "index_of": Builtin(((Kind.STRING, Kind.STRING),), Kind.NUMBER, _index_of),
    "starts_with": _str2(lambda a, b: a.startswith(b)),
    "ends_with": _str2(lambda a, b: a.endswith(b)),
    "contains": _str2(lambda a, b: b in a),
}


def _fits(required: Kind | None, given: Kind) -> bool:
    return required is None or given is required or given is Kind.DYNAMIC


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
        return _number(float(value))
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
            return Expr(Kind.NUMBER, lambda m: UNDEFINED if (v := _number(inner(m))) is UNDEFINED else -v)
        if (op := self.take("NOT")) is not None:
            operand = self.unary()
            if operand.kind not in _LOGIC_KINDS:
                raise self.error(f"operator NOT needs a bool, got {operand.kind.value}", op.column)
            inner = operand.evaluate

            def negate(m: MessageView) -> Any:
                value = _logic(inner(m))
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
            number = _finite_or_inf(lambda: float(token.text))
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
            valid = len(args) >= 2 and all(_fits(builtin.variadic, k) for k in kinds)
        else:
            valid = any(len(o) == len(kinds) and all(_fits(r, k) for r, k in zip(o, kinds, strict=True)) for o in builtin.overloads)
        if not valid:
            given = ", ".join(k.value for k in kinds)
            raise self.error(f"no overload of {name.text.lower()}({given})", name.column)
        evaluators = [a.evaluate for a in args]
        run = builtin.run
        return Expr(builtin.result, lambda m: run(*[e(m) for e in evaluators]))

    # -- builders: each checks operand kinds the way Edge Hub's ConditionVisitor does

    def check_operands(self, op: Token, required: Kind, *operands: Expr) -> None:
        if not all(_fits(required, o.kind) for o in operands):
            given = ", ".join(o.kind.value for o in operands)
            raise self.error(f"operator {op.text!r} needs {required.value} operands, got {given}", op.column)

    def build_arithmetic(self, op: Token, left: Expr, right: Expr) -> Expr:
        lhs, rhs = left.evaluate, right.evaluate
        if op.kind == "||":
            self.check_operands(op, Kind.STRING, left, right)
            return Expr(Kind.STRING, lambda m: _concat(lhs(m), rhs(m)))
        self.check_operands(op, Kind.NUMBER, left, right)
        fn = _ARITHMETIC[op.kind]

        def arithmetic(m: MessageView) -> Any:
            a, b = _number(lhs(m)), _number(rhs(m))
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
                a = _logic(lhs(m))
                if a is False:
                    return False
                b = _logic(rhs(m))
                if b is False:
                    return False
                return True if a is True and b is True else UNDEFINED

            return Expr(Kind.BOOL, conj)
        if left.kind is Kind.NULL and right.kind is Kind.NULL:
            return Expr(Kind.NULL, lambda m: NULL)

        def disj(m: MessageView) -> Any:
            a = _logic(lhs(m))
            if a is True:
                return True
            b = _logic(rhs(m))
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


def compile_condition(text: str, column_offset: int = 0) -> Condition:
    """Parse and type-check ``text``; errors carry the column (shifted by ``column_offset``)."""
    return Condition(text, _Parser(text, column_offset).parse())


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
