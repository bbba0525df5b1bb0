"""The host side of the rig's serial line: one method per command, and ``ERR`` raised as `RigError`.

Scenarios call ``rig.rate(9600)`` and can rely on the link having changed when the call returns, because
the rig replies only after its backend applied the change. Every command and its reply can be reported to
a callback (the scenario's timeline), so a run's record shows exactly when the link changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import serial

BAUD = 115200
REPLY_TIMEOUT_S = 10.0


class RigError(RuntimeError):
    """The rig answered ``ERR <reason>`` (``reason`` holds the text), or did not answer in time."""

    def __init__(self, command: str, reason: str) -> None:
        super().__init__(f"{command}: {reason}")
        self.command = command
        self.reason = reason


class SerialPort(Protocol):
    def write(self, data: bytes) -> int | None: ...

    def readline(self) -> bytes: ...

    def close(self) -> None: ...


CommandLog = Callable[[str, str], None]


class RigClient:
    """Talks to a rig over ``port`` (a device name opened with pyserial, or an open serial-like object)."""

    def __init__(
        self,
        port: str | SerialPort,
        *,
        baudrate: int = BAUD,
        timeout: float = REPLY_TIMEOUT_S,
        on_command: CommandLog | None = None,
    ) -> None:
        self._port: SerialPort = serial.Serial(port, baudrate, timeout=timeout) if isinstance(port, str) else port
        self.on_command = on_command

    def command(self, line: str) -> str:
        """Send one command line; return the reply after ``OK``, raise `RigError` on ``ERR`` or silence."""
        self._port.write(line.encode("ascii") + b"\n")
        raw = self._port.readline()
        reply = raw.decode("ascii", errors="replace").strip()
        if self.on_command is not None:
            self.on_command(line, reply)
        if not raw.endswith(b"\n"):
            raise RigError(line, f"no reply within the timeout (got {reply!r})")
        if reply == "OK" or reply.startswith("OK "):
            return reply[3:]
        if reply.startswith("ERR"):
            raise RigError(line, reply[4:])
        raise RigError(line, f"unexpected reply {reply!r}")

    def rate(self, bits_per_second: int, burst_bytes: int | None = None) -> str:
        """Shape to ``bits_per_second`` (0 removes shaping)."""
        args = f"{bits_per_second}" if burst_bytes is None else f"{bits_per_second} {burst_bytes}"
        return self.command(f"RATE {args}")

    def delay(self, ms: float) -> str:
        return self.command(f"DELAY {ms:g}")

    def jitter(self, ms: float) -> str:
        return self.command(f"JITTER {ms:g}")

    def loss(self, percent: float) -> str:
        return self.command(f"LOSS {percent:g}")

    def down(self) -> str:
        return self.command("DOWN")

    def up(self) -> str:
        return self.command("UP")

    def reset(self) -> str:
        return self.command("RESET")

    def status(self) -> dict[str, str]:
        """STATUS as a dict (``backend``, ``up``, ``rate``, ``features``, endpoints, ...)."""
        return dict(field.split("=", 1) for field in self.command("STATUS").split())

    def features(self) -> frozenset[str]:
        return frozenset(filter(None, self.status()["features"].split(",")))

    def close(self) -> None:
        self._port.close()

    def __enter__(self) -> RigClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
