"""Blocking TCP peers for measuring a link end to end.

The rig's end-to-end tests measure what really arrives: bytes counted at a receiving socket over wall
time, in a window that starts after the bucket's initial burst, so the number is the steady rate.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

WARMUP_S = 0.3  # the bucket's initial burst arrives within this; the window after it sees the steady rate
WINDOW_S = 2.0
CHUNK = b"x" * 16384


def measure_connection(
    server: socket.socket, window: float = WINDOW_S, warmup: float = WARMUP_S, timeout: float = 20
) -> float:
    """Accept one connection and return the steady rate in bits/s over about ``window`` seconds.

    The window starts ``warmup`` seconds after the first byte (past the initial burst). The rate is taken
    between the first and the last arrival inside the window, not over the window's nominal length, so a
    link that delivers whole 1448-byte segments at 64 kbit/s (one per 180 ms) is not misjudged by up to a
    segment either way.
    """
    server.settimeout(timeout)
    connection, _ = server.accept()
    with connection:
        connection.settimeout(timeout)
        first_byte: float | None = None
        window_start: float | None = None
        counted = 0
        while True:
            data = connection.recv(65536)
            now = time.monotonic()
            if not data:
                raise ConnectionError("sender closed before the measurement window ended")
            if first_byte is None:
                first_byte = now
            if now < first_byte + warmup:
                continue
            if window_start is None:
                window_start = now  # this arrival marks the start; its bytes came before it
                continue
            counted += len(data)
            if now >= window_start + window:
                return counted * 8 / (now - window_start)


def drain(connection: socket.socket) -> int:
    """Read whatever is already buffered without waiting; returns how many bytes."""
    total = 0
    connection.setblocking(False)
    try:
        while data := connection.recv(65536):
            total += len(data)
    except BlockingIOError:
        pass
    finally:
        connection.setblocking(True)
    return total


def quiet_for(connection: socket.socket, seconds: float) -> bool:
    """True if no byte arrives on ``connection`` for ``seconds`` (the link is really down)."""
    connection.settimeout(seconds)
    try:
        return not connection.recv(65536)
    except TimeoutError:
        return True


def _flood(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            connection.sendall(CHUNK)


@contextlib.contextmanager
def flooding(connection: socket.socket) -> Iterator[None]:
    """Write to ``connection`` as fast as it accepts, from a background thread, for the block's duration."""
    thread = threading.Thread(target=_flood, args=(connection,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        # Shutting down interrupts a sendall that is blocked on a stalled link.
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)
        thread.join(30)
        connection.close()
