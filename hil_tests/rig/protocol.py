"""The rig's serial line protocol, without I/O: bytes in, commands out; a command and the state, a reply out.

The rig program owns the serial port and the backend; this module decides what every line means. Keeping
the decisions here means a malformed line can be tested to get ``ERR`` without a serial port, and the one
place that turns a problem into an ``ERR <reason>`` line is `RigState.handle` (plus `LineBuffer` for lines
that are not text). A command that changes the link is answered in two steps: `RigState.handle` returns
`Apply` with the settings to try, the program hands them to the backend, and only when the backend took
them does `RigState.commit` make them the rig's state; a backend failure is an ``ERR`` and changes nothing.

Grammar and replies are documented in PROTOCOL.md next to this file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hil_tests.rig.shaping import LinkSettings, SettingsError

DEFAULT_BURST_BYTES = LinkSettings().burst_bytes

MAX_LINE_BYTES = 128
_NUMBER = re.compile(r"^\d+(\.\d+)?$")
_INTEGER = re.compile(r"^\d+$")

# Feature names as STATUS lists them; a backend supports a subset.
FEATURES = ("rate", "delay", "jitter", "loss", "down")


class CommandError(ValueError):
    """A line that is not a valid command; the message is the reason sent after ``ERR``."""


@dataclass(frozen=True)
class Command:
    verb: str
    args: tuple[float, ...] = ()


@dataclass(frozen=True)
class Reply:
    """Send ``line`` and change nothing."""

    line: str


@dataclass(frozen=True)
class Apply:
    """Try ``settings`` on the backend; on success commit them and send ``line``."""

    settings: LinkSettings
    line: str


@dataclass(frozen=True)
class Status:
    """Send the status line: the rig's state plus what only the backend knows (endpoints, counters)."""


Action = Reply | Apply | Status


class LineBuffer:
    """Splits serial bytes into lines (LF or CRLF); an overlong or non-ASCII line becomes a `CommandError`."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._overlong = False

    def feed(self, data: bytes) -> Iterator[str | CommandError]:
        self._pending += data
        while (end := self._pending.find(b"\n")) >= 0:
            raw = bytes(self._pending[:end]).rstrip(b"\r")
            del self._pending[: end + 1]
            if self._overlong or len(raw) > MAX_LINE_BYTES:
                self._overlong = False
                yield CommandError(f"line longer than {MAX_LINE_BYTES} bytes")
                continue
            try:
                yield raw.decode("ascii")
            except UnicodeDecodeError:
                yield CommandError("line is not ASCII")
        if len(self._pending.removesuffix(b"\r")) > MAX_LINE_BYTES:
            # Drop the rest of the line now so a sender that never sends LF cannot grow the buffer. A
            # trailing CR is not counted: it may be the first half of a CRLF whose LF is in the next read.
            self._pending.clear()
            self._overlong = True


def _number(text: str, *, integer: bool = False) -> float:
    if not (_INTEGER if integer else _NUMBER).match(text):
        raise CommandError(f"expected a {'whole ' if integer else ''}non-negative number, got {text!r}")
    return int(text) if integer else float(text)


def _one_number(integer: bool = False) -> Callable[[list[str]], tuple[float, ...]]:
    def parse(args: list[str]) -> tuple[float, ...]:
        if len(args) != 1:
            raise CommandError(f"expected 1 argument, got {len(args)}")
        return (_number(args[0], integer=integer),)

    return parse


def _rate_args(args: list[str]) -> tuple[float, ...]:
    if len(args) not in (1, 2):
        raise CommandError(f"expected RATE <bits/s> [<burst bytes>], got {len(args)} arguments")
    return tuple(_number(arg, integer=True) for arg in args)


def _no_args(args: list[str]) -> tuple[float, ...]:
    if args:
        raise CommandError(f"expected no arguments, got {len(args)}")
    return ()


def _rate_changes(args: tuple[float, ...]) -> dict[str, object]:
    """``RATE r`` means ``RATE r 1600``: the burst is the default unless given. Keeping the last one made
    ``RATE 9600`` after ``RATE 64000 16000`` let 13 s of the slow link through at once."""
    burst = int(args[1]) if len(args) == 2 else DEFAULT_BURST_BYTES
    return {"rate_bps": int(args[0]), "burst_bytes": burst}


@dataclass(frozen=True)
class CommandSpec:
    parse_args: Callable[[list[str]], tuple[float, ...]]
    # Link settings the command changes; None for commands that change no single setting.
    changes: Callable[[tuple[float, ...]], dict[str, object]] | None
    # The feature a backend needs to carry out a non-default value.
    feature: str | None


#: LOSS is kept to the bridge's resolution (1e-7 percent, `kernel.LOSS_MODULUS`), so what the reply and STATUS
#: say is what drops frames: 99.99999999999 used to read ``OK LOSS 100`` and drop every frame while STATUS said
#: ``up=1``, and 1e-8 dropped nothing while STATUS said ``loss=1e-08``. Rounded, they are 100 (refused: use
#: DOWN) and 0.
LOSS_DECIMALS = 7


COMMANDS: dict[str, CommandSpec] = {
    "RATE": CommandSpec(_rate_args, _rate_changes, "rate"),
    "DELAY": CommandSpec(_one_number(), lambda args: {"delay_ms": args[0]}, "delay"),
    "JITTER": CommandSpec(_one_number(), lambda args: {"jitter_ms": args[0]}, "jitter"),
    "LOSS": CommandSpec(
        lambda words: tuple(round(arg, LOSS_DECIMALS) for arg in _one_number()(words)),
        lambda args: {"loss_pct": args[0]},
        "loss",
    ),
    "DOWN": CommandSpec(_no_args, lambda args: {"up": False}, "down"),
    "UP": CommandSpec(_no_args, lambda args: {"up": True}, None),
    "STATUS": CommandSpec(_no_args, None, None),
    "RESET": CommandSpec(_no_args, None, None),
}


def parse_command(line: str) -> Command | None:
    """The command on ``line``; None for a blank line (ignored, no reply); `CommandError` if malformed."""
    words = line.split()
    if not words:
        return None
    verb = words[0].upper()
    if verb not in COMMANDS:
        raise CommandError(f"unknown command {words[0][:20]!r}")
    try:
        return Command(verb, COMMANDS[verb].parse_args(words[1:]))
    except CommandError as error:
        raise CommandError(f"{verb}: {error}") from None


def _format_number(value: float) -> str:
    # Every digit that counts: ``:g`` kept six, so ``LOSS 12.3456789`` was said to be 12.3457.
    return str(int(value)) if float(value).is_integer() else f"{value:.15g}"


class RigState:
    """What the rig's link is set to, and which commands its backend can carry out."""

    def __init__(self, backend: str, features: frozenset[str], defaults: LinkSettings | None = None) -> None:
        unknown = features - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}")
        self.backend = backend
        self.features = features
        self.defaults = defaults or LinkSettings()
        self.settings = self.defaults
        # This rig replaced one that did not stop (killed, crashed, power cut) and undid what it left: the
        # link went back to the defaults behind the host's back. STATUS says so for as long as it runs.
        self.restarted = False

    def handle(self, line: str | CommandError) -> Action | None:
        """The action for one line from the serial port; None for a blank line."""
        try:
            if isinstance(line, CommandError):
                raise line
            command = parse_command(line)
            if command is None:
                return None
            return self._action(command)
        except (CommandError, SettingsError) as error:
            return Reply(f"ERR {error}")

    def commit(self, settings: LinkSettings) -> None:
        self.settings = settings

    def status_line(self, backend_details: dict[str, str]) -> str:
        s = self.settings
        fields = {
            "backend": self.backend,
            "up": "1" if s.up else "0",
            "rate": str(s.rate_bps),
            "burst": str(s.burst_bytes),
            "delay": _format_number(s.delay_ms),
            "jitter": _format_number(s.jitter_ms),
            "loss": _format_number(s.loss_pct),
            "features": ",".join(f for f in FEATURES if f in self.features),
            "restarted": "1" if self.restarted else "0",
            **backend_details,
        }
        return "OK " + " ".join(f"{key}={value}" for key, value in fields.items())

    def _action(self, command: Command) -> Action:
        verb, args = command.verb, command.args
        if verb == "STATUS":
            return Status()
        if verb == "RESET":
            return Apply(self.defaults, "OK RESET")
        spec = COMMANDS[verb]
        assert spec.changes is not None
        changes = spec.changes(args)
        settings = self.settings.replace(**changes)
        # A backend without the feature still accepts the default value, so "DELAY 0" works everywhere.
        if spec.feature is not None and spec.feature not in self.features and any(
            getattr(settings, name) != getattr(self.defaults, name) for name in changes
        ):
            raise CommandError(f"{verb} not supported by backend {self.backend}")
        return Apply(settings, " ".join(["OK", verb, *(_format_number(a) for a in args)]))
