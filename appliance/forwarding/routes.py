"""Routes as objects and the evaluator that turns a message into ``RouteResult``s.

A route string ``FROM <source> [WHERE <condition>] INTO <sink>`` is parsed once, when a manifest is
loaded; the evaluator then only matches sources and runs compiled conditions. As in Edge Hub's
``Evaluator.cs``, the result is a set of (endpoint, priority, TTL) with one entry per endpoint: when two
routes send a message to the same endpoint, the highest priority (lowest number) wins and brings its TTL.
Pure: no asyncio, sockets or sqlite3.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from appliance.forwarding.conditions import MessageView, RouteCondition, compile_condition
from appliance.forwarding.lexer import RouteSyntaxError, Token, tokenize, unescape
from appliance.forwarding.validity import level_problem

#: Priority of a route that names none: below every explicit priority 0-9 (Azure/iotedge's Route_priority_and_TTL.md: ">10").
DEFAULT_PRIORITY = 10
#: Edge Hub's default global TTL (storeAndForwardConfiguration.timeToLiveSecs), 2 hours.
DEFAULT_TTL_S = 7200

UPSTREAM = "upstream"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a route delivers: ``upstream`` or a module input (``modules/{m}/inputs/{i}``)."""

    id: str
    module: str | None = None
    input: str | None = None

    @property
    def is_upstream(self) -> bool:
        return self.id == UPSTREAM


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    text: str
    source: str  # e.g. "/messages/*", matched by whole path segments, case-insensitively
    condition: RouteCondition | None
    endpoint: Endpoint
    priority: int = DEFAULT_PRIORITY
    ttl_s: int = 0  # 0 = the global TTL

    def source_matches(self, message_source: str) -> bool:
        """Edge Hub's ``BaseMessageSource.Match``: both paths end in exactly one ``/`` (the route's after its
        trailing ``*`` is dropped) and the route's is a case-insensitive prefix of the message's, so a prefix
        only ever ends between two segments: ``/messages/modules/m1`` does not take module ``m10``, and
        ``/messages/modules/m1/*`` takes ``m1``'s messages sent without an output name."""
        return _segment_form(message_source).startswith(_segment_form(self.source.rstrip("*")))


@dataclass(frozen=True, slots=True)
class RouteResult:
    endpoint: Endpoint
    priority: int
    ttl_s: int  # effective: the route's TTL, or the global TTL when the route has none


def _segment_form(path: str) -> str:
    return path.strip().rstrip("/").lower() + "/"


class RoutedMessage(MessageView, Protocol):
    @property
    def source(self) -> str: ...


def parse_route(name: str, text: str, priority: int = DEFAULT_PRIORITY, ttl_s: int = 0) -> Route:
    """Parse ``[SELECT *] FROM path [WHERE condition] INTO sink``; errors carry the column in ``text``."""
    tokens = tokenize(text)
    if not tokens:
        raise RouteSyntaxError("empty route", 1)
    index = 0
    if tokens[0].kind == "SELECT":
        if len(tokens) < 2 or tokens[1].kind != "*":
            raise RouteSyntaxError("expected '*' after SELECT", tokens[0].column)
        index = 2
    if index >= len(tokens) or tokens[index].kind != "FROM":
        column = tokens[index].column if index < len(tokens) else len(text) + 1
        raise RouteSyntaxError("a route starts with FROM", column)
    into_positions = [i for i, t in enumerate(tokens) if t.kind == "INTO"]
    if not into_positions:
        raise RouteSyntaxError("missing INTO <sink>", len(text) + 1)
    into = into_positions[-1]
    where = next((i for i in range(index + 1, into) if tokens[i].kind == "WHERE"), None)
    source = _parse_source(text, tokens[index + 1 : where if where is not None else into], tokens[index].column)
    condition = None
    if where is not None:
        start = tokens[where].column + len(tokens[where].text) - 1
        condition = compile_condition(text[start : tokens[into].column - 1], column_offset=start)
    endpoint = _parse_sink(text, tokens[into + 1 :], tokens[into].column)
    return Route(name, text, source, condition, endpoint, priority, ttl_s)


def _parse_source(text: str, tokens: Sequence[Token], from_column: int) -> str:
    """The source is ``'/' item ('/' item)*`` with items identifiers or ``*``, written without spaces."""
    if not tokens:
        raise RouteSyntaxError("missing source after FROM", from_column + 4)
    start = tokens[0].column - 1
    end = tokens[-1].column - 1 + len(tokens[-1].text)
    source = text[start:end]
    expect_slash = True
    for token in tokens:
        if expect_slash and token.kind != "/":
            raise RouteSyntaxError(f"expected '/' in source, found {token.text!r}", token.column)
        if not expect_slash and token.kind not in ("ID", "*"):
            raise RouteSyntaxError(f"expected a name or '*' in source, found {token.text!r}", token.column)
        expect_slash = not expect_slash
    if not expect_slash:
        raise RouteSyntaxError("source ends with '/'", tokens[-1].column)
    if " " in source or "\t" in source:
        raise RouteSyntaxError("spaces inside the source path", tokens[0].column)
    return source


def _parse_sink(text: str, tokens: Sequence[Token], into_column: int) -> Endpoint:
    if not tokens:
        raise RouteSyntaxError("missing sink after INTO", into_column + 4)
    first = tokens[0]
    if first.kind == "SYS_PROP" and len(tokens) == 1:
        if first.text.lower() == "$upstream":
            return Endpoint(UPSTREAM)
        raise RouteSyntaxError(f"unknown system endpoint {first.text!r} (only $upstream)", first.column)
    if (
        first.kind == "ID"
        and first.text.lower() == "brokeredendpoint"
        and [t.kind for t in tokens] == ["ID", "(", "STRING", ")"]
    ):
        target = unescape(tokens[2].text)
        parts = target.strip("/").split("/")
        if len(parts) == 4 and parts[0] == "modules" and parts[2] == "inputs" and parts[1] and parts[3]:
            # Both become levels of the local topic devices/{gateway}/modules/{m}/inputs/{i}.
            problem = level_problem("the module", parts[1]) or level_problem("the input", parts[3])
            if problem is not None:
                raise RouteSyntaxError(f"BrokeredEndpoint {target!r}: {problem.detail}", tokens[2].column)
            return Endpoint(f"modules/{parts[1]}/inputs/{parts[3]}", parts[1], parts[3])
        raise RouteSyntaxError(f"BrokeredEndpoint needs \"/modules/{{m}}/inputs/{{i}}\", got {target!r}", tokens[2].column)
    raise RouteSyntaxError("the sink is $upstream or BrokeredEndpoint(\"/modules/{m}/inputs/{i}\")", first.column)


def explain(route: Route, message: RoutedMessage) -> str | None:
    """Why ``route`` does not take ``message`` (None: it does) - for ``appliance routes check``."""
    if not route.source_matches(message.source):
        return f"source {message.source} is not under FROM {route.source}"
    if route.condition is None:
        return None
    outcome = route.condition.evaluate(message)
    if outcome is True:
        return None
    return f"WHERE {route.condition.text.strip()} is {'false' if outcome is False else 'undefined'}"


class Evaluator:
    """Routes in, ``RouteResult``s out; holds the global TTL that TTL-0 routes inherit."""

    def __init__(self, routes: Iterable[Route], global_ttl_s: int = DEFAULT_TTL_S) -> None:
        self.routes = tuple(routes)
        self.global_ttl_s = global_ttl_s

    def evaluate(self, message: RoutedMessage) -> list[RouteResult]:
        best: dict[str, RouteResult] = {}
        for route in self.routes:
            if not route.source_matches(message.source):
                continue
            if route.condition is not None and not route.condition.matches(message):
                continue
            result = RouteResult(route.endpoint, route.priority, route.ttl_s or self.global_ttl_s)
            current = best.get(route.endpoint.id)
            # Highest priority wins; between equal priorities the longer TTL, so the outcome does not
            # depend on the order routes happen to be listed in.
            if current is None or (result.priority, -result.ttl_s) < (current.priority, -current.ttl_s):
                best[route.endpoint.id] = result
        return sorted(best.values(), key=lambda r: r.endpoint.id)
