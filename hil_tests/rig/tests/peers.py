"""Real TCP peers for the rig's tests: an echo server and a sink that timestamps every byte it receives.

Throughput is measured at the sink over wall time, as bytes that arrived inside a window that starts
after the bucket's initial burst, so the number is the steady rate and not the burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass


def reset_on_close(sock: socket.socket) -> None:
    """SO_LINGER 0: closing ``sock`` then sends an RST, as from a process that died or a host that rebooted."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class Sink:
    """Accepts connections on 127.0.0.1 port 0 and records (time, byte count) of every read."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, int]] = []
        self.data = bytearray()
        self.first_byte: asyncio.Future[float] | None = None
        self.port = 0
        self._grew = asyncio.Event()

    async def received(self, nbytes: int, timeout: float = 10.0) -> None:
        """Wait until at least ``nbytes`` have arrived in total."""
        async with asyncio.timeout(timeout):
            while len(self.data) < nbytes:
                self._grew.clear()
                await self._grew.wait()

    def bytes_between(self, start: float, end: float) -> int:
        return sum(n for t, n in self.arrivals if start <= t < end)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while chunk := await reader.read(65536):
            now = loop.time()
            self.arrivals.append((now, len(chunk)))
            self.data += chunk
            self._grew.set()
            if self.first_byte is not None and not self.first_byte.done():
                self.first_byte.set_result(now)
        writer.close()


@contextlib.asynccontextmanager
async def sink_server() -> AsyncIterator[Sink]:
    sink = Sink()
    sink.first_byte = asyncio.get_running_loop().create_future()
    server = await asyncio.start_server(sink._handle, "127.0.0.1", 0)
    sink.port = server.sockets[0].getsockname()[1]
    try:
        yield sink
    finally:
        server.close()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def flood(host: str, port: int, chunk: bytes = b"x" * 4096) -> None:
    """Write ``chunk`` to ``host:port`` as fast as the connection accepts it, until cancelled."""
    _, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            writer.write(chunk)
            await writer.drain()
    finally:
        writer.transport.abort()


@dataclass(frozen=True)
class MeasuredRate:
    """The rate that reached the sink, and the wall-clock span (``time.time()``) from the first byte to the
    end of the measurement window."""

    bits_per_second: float
    first_byte: float
    end: float


async def measured_rate_bps(sink: Sink, host: str, port: int, seconds: float = 2.0, warmup: float = 0.3) -> MeasuredRate:
    """Flood ``host:port`` (which leads to ``sink``) and measure the rate that reached the sink."""
    assert sink.first_byte is not None
    loop = asyncio.get_running_loop()
    sender = asyncio.ensure_future(flood(host, port))
    try:
        first = await asyncio.wait_for(asyncio.shield(sink.first_byte), 10)
        start = first + warmup
        await asyncio.sleep(start + seconds - loop.time())  # the measurement window
        wall_offset = time.time() - loop.time()
        return MeasuredRate(sink.bytes_between(start, start + seconds) * 8 / seconds,
                            first + wall_offset, start + seconds + wall_offset)
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
