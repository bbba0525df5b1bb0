"""The builtin functions of the WHERE language, as Edge Hub's ``query/builtins/`` defines them.

Rules
-----
* Names are case-insensitive (``compile_condition`` looks them up lowercased).
* Each function lists the argument kinds of every overload it accepts (``None`` = any kind); a call that
  fits no overload is refused when the route is compiled, not when a message arrives.
* At run time a function returns ``UNDEFINED`` for an argument of the wrong type (a ``$body`` query can
  hold anything) and follows the number rules of ``condition_values``: overflow is infinity, a domain
  error undefined.

Pure: no asyncio, sockets or sqlite3.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.forwarding.condition_values import NULL, UNDEFINED, Kind, concat, finite_or_inf, number_value


@dataclass(frozen=True, slots=True)
class Builtin:
    """A function: accepted argument kinds per overload (``None`` = any kind), its result kind and code."""

    overloads: tuple[tuple[Kind | None, ...], ...]
    result: Kind
    run: Callable[..., Any]
    variadic: Kind | None = None  # concat: two or more of this kind


def _num1(fn: Callable[[float], float]) -> Builtin:
    return Builtin(((Kind.NUMBER,),), Kind.NUMBER, lambda x: UNDEFINED if number_value(x) is UNDEFINED else finite_or_inf(lambda: fn(x)))


def _inf_safe(fn: Callable[[float], float]) -> Callable[[float], float]:
    return lambda x: x if math.isinf(x) else fn(x)


_NUMBER_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")


def _as_number(value: Any) -> Any:
    if isinstance(value, float):
        return number_value(value)
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


def _index(value: Any) -> int | None:
    number = number_value(value)
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
        lambda a, b: UNDEFINED if number_value(a) is UNDEFINED or number_value(b) is UNDEFINED else finite_or_inf(lambda: math.pow(a, b)),
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
    "concat": Builtin((), Kind.STRING, concat, variadic=Kind.STRING),
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
