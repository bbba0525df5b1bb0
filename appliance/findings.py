"""What ``appliance doctor`` says about one thing: a check name, a verdict and a sentence for the person on
site. A leaf module, so each subsystem can write its own checks without importing the doctor."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Verdict(enum.Enum):
    OK = "ok"
    PROBLEM = "PROBLEM"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    verdict: Verdict
    message: str
