"""Sans-I/O AT command protocol (3GPP TS 27.007 / V.250 framing): bytes in, events out.

Modems interleave three kinds of lines on one serial stream: the echo of the command we sent, the
command's information lines and final result code, and unsolicited result codes (URCs: ``RDY``,
``+CREG: 5``...) that can arrive at any moment, even between a response's lines. Serial lines also
deliver garbage (line noise, a half-booted modem) and split lines anywhere. Keeping the framing here,
free of I/O and clocks, lets every one of those cases be tested with plain byte strings; the driver
(``modem.py``) only moves bytes and owns the timeouts.

Classification rules, in order, for each complete line:

1. No command pending: a URC if it looks like one (``URC_WORDS`` or ``+NAME: ...``), otherwise noise.
2. The echo of the pending command (modems echo until ``ATE0``) is dropped.
3. A final result code ends the pending command with a ``Response``.
4. For a command with a known reply prefix (``AT+CSQ`` -> ``+CSQ:``), a line with that prefix is an
   information line; any other ``+NAME:`` line or URC word is a URC; anything else is noise.
5. For other commands (``ATI``), URC words are URCs and everything else is an information line.

Known ambiguity: a ``+CREG:`` URC arriving while ``AT+CREG?`` is pending is taken as the reply line,
which is harmless because both carry the registration state.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

#: Result codes that end a command. ``+CME ERROR: <n>`` / ``+CMS ERROR: <n>`` are matched by prefix.
FINAL_OK = frozenset({"OK", "CONNECT"})
FINAL_ERROR = frozenset({"ERROR", "NO CARRIER", "BUSY", "NO ANSWER", "NO DIALTONE"})
FINAL_ERROR_PREFIXES = ("+CME ERROR:", "+CMS ERROR:")

#: Unsolicited words that carry no ``+NAME:`` prefix (Quectel/SIMCom boot and call notices).
URC_WORDS = frozenset({"RDY", "RING", "SMS Ready", "Call Ready", "POWERED DOWN", "NORMAL POWER DOWN"})

#: A line longer than this without a terminator is noise (a modem spewing binary), not a line to keep.
MAX_LINE = 1024

_EXTENDED = re.compile(r"^\+[A-Z0-9]+:")
_COMMAND_PREFIX = re.compile(r"^AT(\+[A-Z0-9]+)(?:\?|=\?|=.*)?$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Response:
    """A command's information lines and its final result code."""

    command: str
    lines: tuple[str, ...]
    result: str

    @property
    def ok(self) -> bool:
        return self.result in FINAL_OK


@dataclass(frozen=True, slots=True)
class Urc:
    line: str


@dataclass(frozen=True, slots=True)
class Noise:
    """Bytes that fit no rule: logged by the driver, never acted on."""

    data: str


Event = Response | Urc | Noise


class ProtocolError(RuntimeError):
    pass


def reply_prefix(command: str) -> str | None:
    """``AT+CSQ`` -> ``+CSQ:``, ``AT+CREG?`` -> ``+CREG:``; None for basic commands such as ``ATI``."""
    match = _COMMAND_PREFIX.match(command)
    return f"{match.group(1).upper()}:" if match else None


def is_final(line: str) -> bool:
    return line in FINAL_OK or line in FINAL_ERROR or line.startswith(FINAL_ERROR_PREFIXES)


def looks_unsolicited(line: str) -> bool:
    return line in URC_WORDS or bool(_EXTENDED.match(line))


class AtConnection:
    """One side of an AT link: ``send(command)`` gives the bytes to write, ``receive_data`` takes bytes
    read, and ``next_event()`` returns the next ``Event`` or None when it needs more data.

    One command at a time, as V.250 requires: the modem ignores a new command until the previous result.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._events: deque[Event] = deque()
        self._pending: str | None = None
        self._prefix: str | None = None
        self._lines: list[str] = []

    @property
    def pending(self) -> str | None:
        return self._pending

    def send(self, command: str) -> bytes:
        if self._pending is not None:
            raise ProtocolError(f"{command!r} sent while {self._pending!r} is still waiting for its result")
        if not command.upper().startswith("AT") or "\r" in command or "\n" in command:
            raise ProtocolError(f"not a single AT command: {command!r}")
        self._pending = command
        self._prefix = reply_prefix(command)
        self._lines = []
        return command.encode("ascii") + b"\r"

    def abandon(self) -> None:
        """The driver gave up waiting (timeout): forget the command; its late lines become noise."""
        self._pending = None
        self._prefix = None
        self._lines = []

    def receive_data(self, data: bytes) -> None:
        self._buffer += data
        while True:
            cut = _first_terminator(self._buffer)
            if cut < 0:
                break
            raw = bytes(self._buffer[:cut])
            del self._buffer[: cut + 1]
            if raw:
                self._line(raw.decode("ascii", errors="replace").strip())
        if len(self._buffer) > MAX_LINE:
            self._events.append(Noise(bytes(self._buffer).decode("ascii", errors="replace")))
            self._buffer.clear()

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def _line(self, line: str) -> None:
        if not line:
            return
        if self._pending is None:
            self._events.append(Urc(line) if looks_unsolicited(line) else Noise(line))
            return
        if line.upper() == self._pending.upper() and not self._lines:
            return  # echo
        if is_final(line):
            self._events.append(Response(self._pending, tuple(self._lines), line))
            self.abandon()
            return
        if self._prefix is not None:
            if line.upper().startswith(self._prefix):
                self._lines.append(line)
            elif looks_unsolicited(line):
                self._events.append(Urc(line))
            else:
                self._events.append(Noise(line))
        elif line in URC_WORDS:
            self._events.append(Urc(line))
        else:
            self._lines.append(line)


def _first_terminator(buffer: bytearray) -> int:
    positions = [p for p in (buffer.find(b"\r"), buffer.find(b"\n")) if p >= 0]
    return min(positions) if positions else -1
