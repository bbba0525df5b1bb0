"""The rig process: ``python -m hil_tests.rig --serial pty|DEVICE --backend userspace|netns|bridge ...``.

A thin asyncio layer: bytes from the serial line go through `protocol.LineBuffer` and `protocol.RigState`,
which decide every reply; this module only carries the resulting actions out on the backend and writes the
reply. Commands are handled one at a time in arrival order, so a reply always belongs to the line before it.

``--serial pty`` makes the rig create a pseudo-terminal pair itself and keep the master end: the host opens
the slave by name with pyserial exactly as it would open ``/dev/ttyUSB0`` on a real bench. When the rig is
ready it prints one JSON line on stdout (serial device, backend, features, endpoints), which is what a bench
waits for instead of sleeping. SIGTERM or SIGINT stops it and removes everything the backend created.

The serial line is `serial_line.SerialLink`'s: absent at start or hung up later, the rig keeps the link as
it is and opens the line again when it is back; replies never block the loop.

Everything a technician needs to act on is one line on stderr (`log`): a failed start (a missing port, a
second rig on the same ports) ends the rig with one ``rig: ...`` line and
exit status 1, never a traceback, so a unit that restarts it fills the journal with one line per attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import serial

from hil_tests.rig.backends import Backend, UserspaceBackend
from hil_tests.rig.bridge import DEFAULT_BRIDGE, RELAY_SLOWEST_RATE_BPS, BridgeBackend
from hil_tests.rig.claim import PortsBusy
from hil_tests.rig.journal import DEFAULT_STATE_DIR, JournalError
from hil_tests.rig.kernel import DEFAULT_QUEUE_SECONDS, BackendError
from hil_tests.rig.netns import NetnsBackend
from hil_tests.rig.protocol import (
    Apply,
    CommandError,
    LineBuffer,
    Reply,
    RigState,
    Status,
)
from hil_tests.rig.serial_line import BAUD, DeviceLine, PtyLine, SerialLine, SerialLink


async def serve(line: SerialLine, backend: Backend, ready_out: TextIO, stop: asyncio.Event) -> None:
    """Start the backend, announce readiness, answer commands until ``stop``, clean up.

    The serial line may be absent at start or hang up later (`SerialLink`): the rig keeps shaping and
    answers again when the line is back; only SIGTERM/SIGINT end it."""
    state = RigState(backend.name, backend.features)
    lines: asyncio.Queue[tuple[int, str | CommandError]] = asyncio.Queue()  # (the line's opening, command)
    buffer = LineBuffer()

    def on_data(data: bytes) -> None:
        for item in buffer.feed(data):
            lines.put_nowait((link.opening, item))

    def on_lost() -> None:
        nonlocal buffer
        buffer = LineBuffer()  # a line cut by the hang-up is void

    link = SerialLink(line, on_data, on_lost, log)
    await backend.start()
    state.restarted = backend.restarted
    stopped = asyncio.ensure_future(stop.wait())
    try:
        link.connect()
        ready = {"event": "ready", "pid": os.getpid(), "serial": line.name, "backend": backend.name}
        ready |= {"features": sorted(backend.features), "restarted": backend.restarted, **backend.details()}
        print(json.dumps(ready), file=ready_out, flush=True)
        while True:
            next_line = asyncio.ensure_future(lines.get())
            await asyncio.wait({stopped, next_line}, return_when=asyncio.FIRST_COMPLETED)
            if not next_line.done():
                next_line.cancel()
                break
            opening, item = next_line.result()
            reply = await _carry_out(state, backend, item, link)
            if reply is not None:
                link.send(reply.encode() + b"\n", opening)
    finally:
        stopped.cancel()
        link.close()
        await backend.close()


def log(message: str) -> None:
    """One line on stderr (the journal on a rig box), prefixed so that it reads well among other units'."""
    print(f"rig: {message}", file=sys.stderr, flush=True)


async def _carry_out(state: RigState, backend: Backend, item: str | CommandError, link: SerialLink) -> str | None:
    action = state.handle(item)
    if action is None:
        return None
    if isinstance(action, Reply):
        return action.line
    if isinstance(action, Status):
        return state.status_line(backend.details() | {"replies_dropped": str(link.replies_dropped)})
    assert isinstance(action, Apply)
    try:
        await backend.apply(action.settings)
    except Exception as error:  # any backend failure becomes an ERR line; the rig keeps serving
        return "ERR backend: " + " ".join(str(error).split())
    state.commit(action.settings)
    return action.line


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def _queue_seconds(value: str) -> float:
    """A positive, finite number of seconds: tbf's limit is RATE x this, in whole bytes (``inf`` used to end
    the rig in a traceback, 0 or a negative one in an ``ERR backend`` for every RATE)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return seconds


def _ports(value: str) -> tuple[str, str]:
    names = value.split(",")
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise argparse.ArgumentTypeError(f"expected two different interfaces IF1,IF2, got {value!r}")
    return names[0], names[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hil_tests.rig", description=__doc__.splitlines()[0])
    parser.add_argument("--serial", required=True, help="serial device, or 'pty' to create a pty pair")
    parser.add_argument("--baud", type=int, default=BAUD)
    parser.add_argument("--backend", choices=("userspace", "netns", "bridge"), required=True)
    parser.add_argument(
        "--target",
        type=_host_port,
        help="the cloud endpoint HOST:PORT (userspace: required; netns: as seen in the cloud namespace; "
        "bridge: as the rig reaches it, needs --address; netns and bridge: enables DELAY/JITTER through a relay)",
    )
    parser.add_argument(
        "--listen",
        type=_host_port,
        help="where the relay listens (default 127.0.0.1:0; netns and bridge: only the port counts)",
    )
    parser.add_argument("--ports", type=_ports, help="bridge: the two interfaces to shape, gateway side first (eth1,eth2)")
    parser.add_argument("--bridge", default=DEFAULT_BRIDGE, help=f"bridge: the bridge to create or reuse ({DEFAULT_BRIDGE})")
    parser.add_argument("--address", help="bridge: an address (CIDR) for the bridge, where the delay relay listens")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help="bridge: where the rig records what it changed, to undo it after a crash "
                        f"(default {DEFAULT_STATE_DIR}; the unit's RuntimeDirectory)")
    parser.add_argument("--run-id", help="netns: suffix of the namespace names (default: random)")
    parser.add_argument("--queue-s", type=_queue_seconds, default=DEFAULT_QUEUE_SECONDS,
                        help="netns, bridge: how many seconds of traffic at the current rate tbf queues (default 1)")
    parser.add_argument("--relay-slowest-rate", type=int, default=RELAY_SLOWEST_RATE_BPS, metavar="BITS_PER_S",
                        help="bridge: the slowest RATE the delay relay's retransmission floor is sized for "
                        f"(default {RELAY_SLOWEST_RATE_BPS}; PROTOCOL.md)")
    return parser


def make_backend(args: argparse.Namespace) -> Backend:
    if args.backend == "userspace":
        if args.target is None:
            raise SystemExit("--backend userspace needs --target HOST:PORT")
        return UserspaceBackend(*args.target, *(args.listen or ("127.0.0.1", 0)))
    relay_port = args.listen[1] if args.listen else 0
    if args.backend == "bridge":
        if args.ports is None:
            raise SystemExit("--backend bridge needs --ports IF1,IF2 (gateway side first)")
        try:
            return BridgeBackend(
                args.ports, args.bridge, args.address, args.target, relay_port, args.queue_s, args.relay_slowest_rate,
                state_dir=args.state_dir,
            )
        except ValueError as error:
            raise SystemExit(str(error)) from None
    return NetnsBackend(args.run_id, args.target, relay_port, args.queue_s)


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    backend = make_backend(args)
    line: SerialLine = PtyLine() if args.serial == "pty" else DeviceLine(args.serial, args.baud)
    try:
        await serve(line, backend, sys.stdout, stop)
    finally:
        line.close()


#: What ends a start with one line: the rig's own refusals and the kernel's or the filesystem's answers.
START_FAILURES = (BackendError, PortsBusy, JournalError, OSError, serial.SerialException)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        asyncio.run(_main(args))
    except START_FAILURES as error:
        notes = "".join(f"; {note}" for note in getattr(error, "__notes__", ()))
        log(f"cannot run: {' '.join(str(error).split())}{notes}")
        raise SystemExit(1) from None
