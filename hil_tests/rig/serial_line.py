"""The rig's serial line: a pty it makes or a device it opens, kept open across hang-ups, written without blocking.

A rig box's serial line comes and goes while the link it shapes must not: a USB-serial adapter is pulled and
put back, a g_serial gadget's host (the bench PC) reboots. A hang-up is therefore an event, not an error and
not the end: `SerialLink` logs it once, leaves the link exactly as the last command set it (the host that
comes back reads it with STATUS), and tries to open the device again every `REOPEN_INTERVAL_S` until it is
there. Before, pyserial's ``in_waiting`` raised ``OSError(EIO)`` on a hung-up line, which was not caught: the
reader callback raised on every turn of the loop, 1-4 s of CPU and 7-37 MB of tracebacks per 5 s.

The loop never blocks on the serial side: replies go out through `ReplyWriter`, non-blocking, and a host
that writes commands but never reads the answers fills at most ``MAX_UNREAD_REPLY_BYTES``; replies beyond
that are dropped and counted (``replies_dropped`` in STATUS). Before, one blocking ``os.write`` on a full
pty stopped the relay in both directions and left SIGTERM's handler unable to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tty
from collections.abc import Callable
from typing import Protocol

import serial

BAUD = 115200
#: Replies the host has not read yet that the rig keeps; a longer backlog means nobody is reading.
MAX_UNREAD_REPLY_BYTES = 4096
#: How often a rig whose line is gone tries to open it again (a replugged adapter is back within this).
REOPEN_INTERVAL_S = 0.5


class SerialLine(Protocol):
    name: str

    def open(self) -> int:
        """Open the line and return its descriptor; `OSError` or `serial.SerialException` if it is not there."""

    def read_available(self) -> bytes | None:
        """What is buffered now; b"" means the line hung up, None that nothing is there after all."""

    def close(self) -> None:
        """Close the line; safe to call when it is closed."""


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
        self._open = True

    def open(self) -> int:
        if not self._open:
            raise OSError(f"the rig's pty {self.name} is closed")
        return self._master

    def read_available(self) -> bytes | None:
        try:
            return os.read(self._master, 4096)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def close(self) -> None:
        if self._open:
            self._open = False
            os.close(self._master)
            os.close(self._slave)


class DeviceLine:
    """A serial device opened by name with pyserial (a real port, a udev symlink, someone else's pty slave)."""

    def __init__(self, device: str, baudrate: int = BAUD) -> None:
        self.name = device
        self._baudrate = baudrate
        self._port: serial.Serial | None = None

    def open(self) -> int:
        self.close()
        self._port = serial.Serial(self.name, self._baudrate, timeout=0)
        return int(self._port.fileno())

    def read_available(self) -> bytes | None:
        assert self._port is not None
        try:
            return bytes(self._port.read(self._port.in_waiting or 1))
        except (serial.SerialException, OSError):  # in_waiting's ioctl says EIO on a hung-up line
            return b""

    def close(self) -> None:
        if self._port is not None:
            port, self._port = self._port, None
            with contextlib.suppress(serial.SerialException, OSError):  # a line that is already gone
                port.close()


class ReplyWriter:
    """Writes replies to one open descriptor of the serial line without ever blocking the loop.

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
        except OSError:  # the line went away; the reader sees the hang-up
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


class SerialLink:
    """Keeps ``line`` open for the rig's whole life: open now or as soon as it appears, reopen after a hang-up.

    ``on_data`` gets every chunk read; ``on_lost`` is called on a hang-up (a half-received line is void);
    ``log`` gets one line per change of the line's state (absent, hung up, back), never one per retry.
    """

    def __init__(
        self,
        line: SerialLine,
        on_data: Callable[[bytes], None],
        on_lost: Callable[[], None],
        log: Callable[[str], None],
        reopen_interval_s: float = REOPEN_INTERVAL_S,
    ) -> None:
        self.line = line
        self._on_data = on_data
        self._on_lost = on_lost
        self._log = log
        self._interval = reopen_interval_s
        self._fd: int | None = None
        self._writer: ReplyWriter | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._missing_since_logged = False
        self._dropped_before = 0  # replies dropped by writers of earlier opens of the line
        self._closed = False
        self.opening = 0  # how many times the line was opened: which host a command came from

    @property
    def connected(self) -> bool:
        return self._fd is not None

    @property
    def replies_dropped(self) -> int:
        return self._dropped_before + (self._writer.dropped if self._writer is not None else 0)

    def connect(self) -> None:
        """Open the line now, or log once that it is not there and keep trying."""
        self._retry = None
        if self._closed:
            return
        try:
            fd = self.line.open()
        except (OSError, serial.SerialException) as error:
            if not self._missing_since_logged:
                self._log(f"serial line {self.line.name} is not there ({_reason(error)}); the link keeps its "
                          f"settings; opening it again every {self._interval:g} s")
                self._missing_since_logged = True
            self._retry = asyncio.get_running_loop().call_later(self._interval, self.connect)
            return
        if self._missing_since_logged:
            self._log(f"serial line {self.line.name} is back")
            self._missing_since_logged = False
        self.opening += 1
        self._fd = fd
        self._writer = ReplyWriter(fd)
        asyncio.get_running_loop().add_reader(fd, self._readable)

    def send(self, data: bytes, opening: int) -> None:
        """Send the reply to a command read while the line was open for the ``opening``-th time.

        With no line open, or if the line hung up since that command was read, it is dropped and counted,
        as for a host that does not read: a host that opens the line again must read the answer to its own
        next command, not the answers to commands queued before the hang-up (those are still carried out,
        as ``echo DOWN > /dev/hilrig`` expects)."""
        if self._writer is None or opening != self.opening:
            self._dropped_before += 1
            return
        self._writer.send(data)

    def _readable(self) -> None:
        data = self.line.read_available()
        if data is None:
            return
        if data:
            self._on_data(data)
            return
        self._log(f"serial line {self.line.name} hung up; the link keeps its settings; opening it again every "
                  f"{self._interval:g} s")
        self._missing_since_logged = True
        self._disconnect()
        self._on_lost()
        self._retry = asyncio.get_running_loop().call_later(self._interval, self.connect)

    def _disconnect(self) -> None:
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            self._fd = None
        if self._writer is not None:
            self._writer.close()
            self._dropped_before += self._writer.dropped
            self._writer = None
        self.line.close()

    def close(self) -> None:
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._disconnect()


def _reason(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
