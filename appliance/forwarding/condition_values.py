"""Values of the WHERE language and the operators on them, as Edge Hub's ``query/types`` defines them.

Rules
-----
* A value at run time is ``True``/``False``, a float, a string, ``NULL`` or ``UNDEFINED``; a NaN is
  ``UNDEFINED``. Every number is a float, because Edge Hub's are .NET doubles: an overflow is infinity and
  a domain error (``sqrt(-1)``, ``0 / 0``) is undefined, never an exception.
* Logic is three-valued (Edge Hub's ``Bool.cs``): ``UNDEFINED and false`` is false, ``UNDEFINED or true``
  is true, anything else with ``UNDEFINED`` stays undefined. In ``and``/``or`` a null counts as false.
* A comparison of two values of different types, or with ``UNDEFINED`` on either side, is undefined; only
  ``=``/``!=``/``<>`` compare with null.

Pure: no asyncio, sockets or sqlite3.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any


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


def kind_fits(required: Kind | None, given: Kind) -> bool:
    """``given`` may stand where ``required`` is expected (``None`` = any kind; a ``$body`` query fits all)."""
    return required is None or given is required or given is Kind.DYNAMIC


def to_bool(value: Any) -> Any:
    """A condition's final value as three-valued logic: null is false, a number or string undefined."""
    if value is True or value is False:
        return value
    if value is NULL:
        return False
    return UNDEFINED


def logic_value(value: Any) -> Any:
    """An ``and``/``or`` operand: null counts as false there (``null or false`` is false)."""
    if value is NULL:
        return False
    return value if value is True or value is False else UNDEFINED


def number_value(value: Any) -> Any:
    if isinstance(value, float) and not isinstance(value, bool):
        return UNDEFINED if math.isnan(value) else value
    return UNDEFINED


def finite_or_inf(op: Callable[[], float]) -> Any:
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
    return finite_or_inf(lambda: a / b)


def _modulo(a: float, b: float) -> Any:
    return finite_or_inf(lambda: math.fmod(a, b))


ARITHMETIC: dict[str, Callable[[float, float], Any]] = {
    "+": lambda a, b: finite_or_inf(lambda: a + b),
    "-": lambda a, b: finite_or_inf(lambda: a - b),
    "*": lambda a, b: finite_or_inf(lambda: a * b),
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


def concat(*parts: Any) -> Any:
    if any(p is UNDEFINED or not (isinstance(p, str) or p is NULL) for p in parts):
        return UNDEFINED
    return "".join("" if p is NULL else p for p in parts)
