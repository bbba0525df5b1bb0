"""The rig process: ``python -m hil_tests.rig --serial pty|DEVICE --backend userspace|netns|bridge ...``.

A thin asyncio layer: bytes from the serial line go through `protocol.LineBuffer` and `protocol.RigState`,
which decide every reply; this module only carries the resulting actions out on the backend and writes the
reply. Commands are handled one at a time in arrival order, so a reply always belongs to the line before it.

``--serial pty`` makes the rig create a pseudo-terminal pair itself and keep the master end: the host opens
the slave by name with pyserial exactly as it would open ``/dev/ttyUSB0`` on a real bench. When the rig is
ready it prints one JSON line on stdout (serial device, backend, features, endpoints), which is what a bench
waits for instead of sleeping. SIGTERM or SIGINT stops it and removes everything the backend created.

The loop never blocks on the serial side: replies go out through `ReplyWriter`, non-blocking, and a host
that writes commands but never reads the answers fills at most ``MAX_UNREAD_REPLY_BYTES``; replies beyond
that are dropped and counted (``replies_dropped`` in STATUS). Before, one blocking ``os.write`` on a full
pty stopped the relay in both directions and left SIGTERM's handler unable to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tty
from collections.abc import Sequence
from typing import Protocol, TextIO

import serial

from hil_tests.rig.backends import Backend, UserspaceBackend
from hil_tests.rig.bridge import DEFAULT_BRIDGE, RELAY_SLOWEST_RATE_BPS, BridgeBackend
from hil_tests.rig.kernel import DEFAULT_QUEUE_SECONDS
from hil_tests.rig.netns import NetnsBackend
from hil_tests.rig.protocol import (
    Apply,
    CommandError,
    LineBuffer,
    Reply,
    RigState,
    Status,
)

BAUD = 115200

#: Replies the host has not read yet that the rig keeps; a longer backlog means nobody is reading.
MAX_UNREAD_REPLY_BYTES = 4096


class SerialLine(Protocol):
    name: str

    def fileno(self) -> int: ...

    def read_available(self) -> bytes | None:
        """What is buffered now; b"" means the line hung up, None that nothing is there after all."""

    def close(self) -> None: ...


class PtyLine:
    """A pseudo-terminal pair made by the rig: the rig keeps the master, the host opens ``name``.

    The rig also keeps a slave descriptor open, so the host may open and close the device as often as it
    likes without the master seeing a hang-up; the slave is raw so nothing is echoed or translated.
    """

    def __init__(self) -> None:
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        os.set_blocking(self._master, False)
        self.name = os.ttyname(self._slave)

    def fileno(self) -> int:
        return self._master

    def read_available(self) -> bytes | None:
        try:
            return os.read(self._master, 4096)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def close(self) -> None:
        os.close(self._master)
        os.close(self._slave)


class DeviceLine:
    """A serial device opened with pyserial (a real port, or the slave end of someone else's pty)."""

    def __init__(self, device: str, baudrate: int = BAUD) -> None:
        self._port = serial.Serial(device, baudrate, timeout=0)
        self.name = device

    def fileno(self) -> int:
        return self._port.fileno()

    def read_available(self) -> bytes | None:
        try:
            return bytes(self._port.read(self._port.in_waiting or 1))
        except serial.SerialException:
            return b""

    def close(self) -> None:
        self._port.close()


async def serve(line: SerialLine, backend: Backend, ready_out: TextIO, stop: asyncio.Event) -> None:
    """Start the backend, announce readiness, answer commands until ``stop`` or hang-up, clean up."""
    loop = asyncio.get_running_loop()
    state = RigState(backend.name, backend.features)
    lines: asyncio.Queue[str | CommandError | None] = asyncio.Queue()
    buffer = LineBuffer()
    replies = ReplyWriter(line.fileno())

    def on_readable() -> None:
        data = line.read_available()
        if data is None:
            return
        if not data:
            loop.remove_reader(line.fileno())
            lines.put_nowait(None)
            return
        for item in buffer.feed(data):
            lines.put_nowait(item)

    await backend.start()
    stopped = asyncio.ensure_future(stop.wait())
    try:
        loop.add_reader(line.fileno(), on_readable)
        ready = {"event": "ready", "pid": os.getpid(), "serial": line.name, "backend": backend.name}
        ready |= {"features": sorted(backend.features), **backend.details()}
        print(json.dumps(ready), file=ready_out, flush=True)
        while True:
            next_line = asyncio.ensure_future(lines.get())
            await asyncio.wait({stopped, next_line}, return_when=asyncio.FIRST_COMPLETED)
            if not next_line.done():
                next_line.cancel()
                break
            item = next_line.result()
            if item is None:
                break
            reply = await _carry_out(state, backend, item, replies)
            if reply is not None:
                replies.send(reply.encode() + b"\n")
    finally:
        stopped.cancel()
        loop.remove_reader(line.fileno())
        replies.close()
        await backend.close()


class ReplyWriter:
    """Writes replies to the serial line without ever blocking the loop.

    What the line does not take at once waits in a buffer flushed when the descriptor is writable; while
    that buffer holds ``MAX_UNREAD_REPLY_BYTES`` or more, a new reply is dropped whole (never cut) and
    counted, so a host that reads again finds whole lines and can see in STATUS what it missed.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._pending = bytearray()
        self._watching = False
        self.dropped = 0

    def send(self, data: bytes) -> None:
        if len(self._pending) >= MAX_UNREAD_REPLY_BYTES:
            self.dropped += 1
            return
        self._pending += data
        self._flush()

    def _flush(self) -> None:
        try:
            while self._pending:
                written = os.write(self._fd, self._pending)
                del self._pending[:written]
        except BlockingIOError:
            pass
        except OSError:  # the line went away; the reader sees the hang-up and ends the session
            self._pending.clear()
        self._watch(bool(self._pending))

    def _watch(self, wanted: bool) -> None:
        if wanted != self._watching:
            loop = asyncio.get_running_loop()
            if wanted:
                loop.add_writer(self._fd, self._flush)
            else:
                loop.remove_writer(self._fd)
            self._watching = wanted

    def close(self) -> None:
        self._watch(False)


async def _carry_out(state: RigState, backend: Backend, item: str | CommandError, replies: ReplyWriter) -> str | None:
    action = state.handle(item)
    if action is None:
        return None
    if isinstance(action, Reply):
        return action.line
    if isinstance(action, Status):
        return state.status_line(backend.details() | {"replies_dropped": str(replies.dropped)})
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
    parser.add_argument("--run-id", help="netns: suffix of the namespace names (default: random)")
    parser.add_argument("--queue-s", type=float, default=DEFAULT_QUEUE_SECONDS,
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
                args.ports, args.bridge, args.address, args.target, relay_port, args.queue_s, args.relay_slowest_rate
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


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(_main(build_parser().parse_args(argv)))
