"""The gateway's one Prometheus exposition: every subsystem hands its figures over as ``Family`` values
and this module alone writes the text format (version 0.0.4); ``metrics_server`` serves it on
``/metrics``. No I/O here, so the broker's I/O-free modules can describe their figures too.

Why one place: label values come from configuration and devices (an endpoint id, a modem's operator
name), and the text format needs ``\\``, ``"`` and newlines escaped in them; a renderer per subsystem had
already forgotten that once. Names are checked here too, so a typo becomes an error in the tests rather
than a scrape that Prometheus refuses whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True, slots=True)
class Family:
    """One metric: its name, type, help text and samples (labels, value). A counter's name ends in
    ``_total`` (checked)."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    samples: Sequence[tuple[dict[str, str], float]] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"invalid metric name {self.name!r}")
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name!r} must end in _total")
        for labels, _ in self.samples:
            for label in labels:
                if not _LABEL.fullmatch(label) or label.startswith("__"):
                    raise ValueError(f"invalid label name {label!r} in {self.name}")


def gauge(name: str, help_text: str, value: float, **labels: str) -> Family:
    return Family(name, "gauge", help_text, ((labels, value),))


def counter(name: str, help_text: str, value: float, **labels: str) -> Family:
    return Family(name, "counter", help_text, ((labels, value),))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(families: Iterable[Family]) -> str:
    """The text format; families of the same name (from several sources) are merged under one header."""
    merged: dict[str, Family] = {}
    for family in families:
        known = merged.get(family.name)
        if known is None:
            merged[family.name] = family
        elif known.kind != family.kind:
            raise ValueError(f"{family.name} is both a {known.kind} and a {family.kind}")
        else:
            merged[family.name] = Family(known.name, known.kind, known.help, (*known.samples, *family.samples))
    lines: list[str] = []
    for family in merged.values():
        lines += [f"# HELP {family.name} {_escape_help(family.help)}", f"# TYPE {family.name} {family.kind}"]
        for labels, value in family.samples:
            text = ",".join(f'{name}="{_escape_label(str(label))}"' for name, label in labels.items())
            lines.append(f"{family.name}{{{text}}} {_number(value)}" if text else f"{family.name} {_number(value)}")
    return "\n".join(lines) + "\n" if lines else ""
