"""The ``$edgeHub`` deployment manifest: validation with JSON Schema, then route compilation.

A manifest is a whole IoT Edge deployment file (``{"modulesContent": {"$edgeHub": {"properties.desired":
{...}}, ...}}``, as ``iotedge``'s deployment.json has it; only the ``$edgeHub`` section is read), the
``{"$edgeHub": {"properties.desired": {...}}}`` document, or just the desired-properties object. Loading is
all-or-nothing: the first bad field raises ``ManifestError`` naming its JSON path
(``$.routes.alerts.priority``) - and for a route, the column in the route string - so the caller keeps the
routes it is running. The schema is the ``routes`` schema of Azure/iotedge's Route_priority_and_TTL.md
plus the fields of schemaVersion 1.1.0 that this gateway reads; schemaVersion 1.0 to 1.3 are accepted, as
Edge Hub accepts them (its own sample deployments use 1.2), and the sections routes do not use
(``mqttBroker``) are left alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from appliance.forwarding.lexer import RouteSyntaxError
from appliance.forwarding.routes import (
    DEFAULT_PRIORITY,
    DEFAULT_TTL_S,
    Evaluator,
    Route,
    parse_route,
)

#: 1.0, 1.1, 1.2, 1.3, each also with a build and revision number (``1.2.0``).
SCHEMA_VERSION_PATTERN = r"^1\.[0-3](\.[0-9]+){0,2}$"

SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["schemaVersion", "routes"],
    "properties": {
        # Edge Hub parses the version as .NET's System.Version and reads major 1, minors 0 to 3
        # (EdgeHubConfigParser); 1.2 adds the mqttBroker section, 1.3 nothing routes read.
        "schemaVersion": {"type": "string", "pattern": SCHEMA_VERSION_PATTERN},
        "routes": {
            "type": "object",
            "patternProperties": {
                "^[^\\.\\$# ]+$": {
                    "anyOf": [
                        {"type": "string", "pattern": "^.+$"},
                        {
                            "type": "object",
                            "required": ["route"],
                            "properties": {
                                "route": {"type": "string", "pattern": "^.+$"},
                                "priority": {"type": "integer", "minimum": 0, "maximum": 9},
                                "timeToLiveSecs": {"type": "integer", "minimum": 0, "maximum": 4294967295},
                            },
                            "additionalProperties": False,
                        },
                    ]
                }
            },
            "additionalProperties": False,
        },
        "storeAndForwardConfiguration": {
            "type": "object",
            "properties": {"timeToLiveSecs": {"type": "integer", "minimum": 0, "maximum": 4294967295}},
        },
    },
}

_VALIDATOR = jsonschema.Draft7Validator(SCHEMA)


class ManifestError(ValueError):
    """A manifest that cannot replace the running routes; ``path`` is a JSON path like ``$.routes.r1``."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True, slots=True)
class Manifest:
    routes: tuple[Route, ...]
    global_ttl_s: int
    source: str
    global_ttl_explicit: bool = True  # False: storeAndForwardConfiguration.timeToLiveSecs absent, Edge Hub's default

    def ttl_origin(self, route: Route) -> tuple[int, str]:
        """A route's effective TTL and where it comes from (what ``routes show`` and ``check`` print)."""
        if route.ttl_s:
            return route.ttl_s, "route timeToLiveSecs"
        if self.global_ttl_explicit:
            return self.global_ttl_s, "storeAndForwardConfiguration.timeToLiveSecs"
        return self.global_ttl_s, "default (no storeAndForwardConfiguration.timeToLiveSecs)"

    def evaluator(self) -> Evaluator:
        return Evaluator(self.routes, self.global_ttl_s)


def _json_path(parts: Any) -> str:
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _deepest_error(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For ``anyOf`` failures, report the branch that got furthest, so the path names the bad field."""
    while error.context:
        error = max(error.context, key=lambda e: (len(e.absolute_path), e.validator != "type"))
    return error


def parse_manifest(document: Any, source: str = "<manifest>") -> Manifest:
    """Validate and compile; raises ``ManifestError`` and changes nothing on the first problem."""
    manifest, problems = _compile(document, source)
    if problems:
        raise problems[0]
    assert manifest is not None
    return manifest


def manifest_problems(document: Any, source: str = "<manifest>") -> list[ManifestError]:
    """Every problem of the manifest, not only the first (``appliance check-config``)."""
    return _compile(document, source)[1]


def _compile(document: Any, source: str) -> tuple[Manifest | None, list[ManifestError]]:
    prefix: list[str] = []
    desired = document
    if isinstance(document, dict) and "modulesContent" in document:
        modules = document["modulesContent"]
        if not isinstance(modules, dict) or not isinstance(modules.get("$edgeHub"), dict):
            return None, [ManifestError("$.modulesContent", "this is a deployment file without an $edgeHub section; "
                                        "the $edgeHub section is at modulesContent.$edgeHub.properties.desired")]
        prefix, document = ["modulesContent"], modules
    if isinstance(document, dict) and "$edgeHub" in document:
        prefix += ["$edgeHub", "properties.desired"]
        desired = document.get("$edgeHub", {}).get("properties.desired") if isinstance(document["$edgeHub"], dict) else None
        if desired is None:
            return None, [ManifestError(_json_path(prefix[:-1]), "missing 'properties.desired'")]
    problems = [
        ManifestError(_json_path(prefix + list(error.absolute_path)), error.message)
        for error in map(_deepest_error, sorted(_VALIDATOR.iter_errors(desired), key=lambda e: list(map(str, e.absolute_path))))
    ]
    routes: list[Route] = []
    specs = desired.get("routes") if isinstance(desired, dict) else None
    for name, spec in (specs.items() if isinstance(specs, dict) else ()):
        if isinstance(spec, str):
            text, priority, ttl, path = spec, DEFAULT_PRIORITY, 0, prefix + ["routes", name]
        elif isinstance(spec, dict) and isinstance(spec.get("route"), str):
            text, path = spec["route"], prefix + ["routes", name, "route"]
            priority, ttl = spec.get("priority", DEFAULT_PRIORITY), spec.get("timeToLiveSecs", 0)
        else:
            continue  # its shape is a schema problem, reported above
        try:
            routes.append(parse_route(name, text, priority, ttl))
        except RouteSyntaxError as exc:
            problems.append(ManifestError(_json_path(path), f"{exc} in {text!r}"))
    if problems:
        return None, problems
    configured = desired.get("storeAndForwardConfiguration", {}).get("timeToLiveSecs")
    ttl_s = DEFAULT_TTL_S if configured is None else configured
    return Manifest(tuple(routes), ttl_s, source, configured is not None), []


def read_manifest_document(path: Path) -> Any:
    """The JSON document in ``path``; ``ManifestError`` naming the file, line and column if there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 ({exc.reason})"
        raise ManifestError("$", f"cannot read {path}: {reason}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError("$", f"{path}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc


def load_manifest(path: Path) -> Manifest:
    return parse_manifest(read_manifest_document(path), str(path))
