"""What the modem tells us, as typed values: signal (``+CSQ``), registration (``+CREG``/``+CEREG``),
operator and radio technology (``+COPS``). Pure parsing of 3GPP TS 27.007 reply lines, no I/O, so the
odd formats (quoted operator names, optional fields, 99 = "unknown") are tested on strings alone.
"""

from __future__ import annotations

import csv
import enum
from dataclasses import dataclass, field


class Registration(enum.IntEnum):
    """``<stat>`` of ``+CREG``/``+CEREG``."""

    NOT_SEARCHING = 0
    HOME = 1
    SEARCHING = 2
    DENIED = 3
    UNKNOWN = 4
    ROAMING = 5

    @property
    def registered(self) -> bool:
        return self in (Registration.HOME, Registration.ROAMING)


#: ``<AcT>`` of ``+COPS`` (TS 27.007 7.3), in the words an operator uses.
TECHNOLOGIES = {
    0: "GSM",
    1: "GSM Compact",
    2: "UMTS",
    3: "EDGE",
    4: "HSDPA",
    5: "HSUPA",
    6: "HSPA",
    7: "LTE",
    8: "EC-GSM-IoT",
    9: "NB-IoT",
    10: "LTE (5GC)",
    11: "NR (5GC)",
    12: "NG-RAN",
    13: "EN-DC",
}


class ReplyError(ValueError):
    """A reply line did not have the documented shape."""


@dataclass(frozen=True, slots=True)
class Signal:
    rssi_dbm: int | None  # None: the modem does not know (99)
    ber: int | None


@dataclass(frozen=True, slots=True)
class Operator:
    name: str | None
    technology: str | None


@dataclass(slots=True)
class ModemStatus:
    """The latest readings; what ``$SYS/gateway/modem/...`` and the metrics show."""

    responding: bool = False
    signal: Signal | None = None
    registration: dict[str, Registration] = field(default_factory=dict)  # "CREG"/"CEREG" -> state
    operator: Operator | None = None
    power_cycles: int = 0

    @property
    def registered(self) -> bool:
        return any(state.registered for state in self.registration.values())

    def as_metrics(self) -> dict[str, str | int | bool | None]:
        """Flat name -> value pairs; the names are the ``$SYS/gateway/modem/<name>`` topic leaves."""
        return {
            "responding": self.responding,
            "registered": self.registered,
            "rssi_dbm": self.signal.rssi_dbm if self.signal else None,
            "ber": self.signal.ber if self.signal else None,
            "registration": ",".join(f"{k}={v.name.lower()}" for k, v in sorted(self.registration.items())) or None,
            "operator": self.operator.name if self.operator else None,
            "technology": self.operator.technology if self.operator else None,
            "power_cycles": self.power_cycles,
        }


def _fields(line: str, prefix: str) -> list[str]:
    if not line.upper().startswith(prefix):
        raise ReplyError(f"expected a {prefix} line, got {line!r}")
    return [part.strip() for part in next(csv.reader([line[len(prefix) :].strip()]))]


def _int(value: str, line: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ReplyError(f"expected a number in {line!r}, got {value!r}") from None


def parse_csq(line: str) -> Signal:
    """``+CSQ: <rssi>,<ber>``: rssi 0..31 maps to -113..-51 dBm in 2 dB steps, 99 is unknown."""
    parts = _fields(line, "+CSQ:")
    if len(parts) != 2:
        raise ReplyError(f"expected +CSQ: <rssi>,<ber>, got {line!r}")
    rssi, ber = _int(parts[0], line), _int(parts[1], line)
    if not (0 <= rssi <= 31 or rssi == 99) or not (0 <= ber <= 7 or ber == 99):
        raise ReplyError(f"values out of range in {line!r}")
    return Signal(rssi_dbm=None if rssi == 99 else -113 + 2 * rssi, ber=None if ber == 99 else ber)


def parse_registration(line: str) -> tuple[str, Registration]:
    """``+CREG: <n>,<stat>[,...]`` (read reply) or ``+CREG: <stat>[,...]`` (URC with n=1)."""
    name = line.split(":", 1)[0].lstrip("+").upper()
    if name not in ("CREG", "CEREG", "CGREG"):
        raise ReplyError(f"not a registration line: {line!r}")
    parts = _fields(line, f"+{name}:")
    # The read reply starts with <n>,<stat>; a URC starts with <stat>, then quoted location fields, so
    # "second raw field is an unquoted number" tells the two apart.
    raw = line.split(":", 1)[1].split(",")
    is_read_reply = len(raw) >= 2 and raw[1].strip().isdigit()
    stat = _int(parts[1] if is_read_reply else parts[0], line)
    try:
        return name, Registration(stat)
    except ValueError:
        raise ReplyError(f"unknown registration state {stat} in {line!r}") from None


def parse_cops(line: str) -> Operator:
    """``+COPS: <mode>[,<format>,"<oper>"[,<AcT>]]``; only <mode> when not registered."""
    parts = _fields(line, "+COPS:")
    if not parts or not parts[0].isdigit():
        raise ReplyError(f"expected +COPS: <mode>,..., got {line!r}")
    name = parts[2] if len(parts) >= 3 and parts[2] else None
    technology = None
    if len(parts) >= 4 and parts[3]:
        act = _int(parts[3], line)
        technology = TECHNOLOGIES.get(act, f"AcT {act}")
    return Operator(name=name, technology=technology)
