"""The gateway's Prometheus endpoint: ``GET /metrics`` on one address, each scrape asking every collector
(the broker and each service) afresh and rendered by ``appliance.prometheus``. Anything else is a 404, a
request that does not arrive within ``REQUEST_TIMEOUT_S`` is dropped, and one connection is one scrape
(``Connection: close``), which is all Prometheus needs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from appliance.prometheus import Family, render

#: Seconds a scraper has to send its request line and headers.
REQUEST_TIMEOUT_S = 5.0

Collector = Callable[[], Awaitable[Sequence[Family]]]


class MetricsServer:
    def __init__(self, collectors: Sequence[Collector]) -> None:
        self._collectors = list(collectors)
        self._server: asyncio.AbstractServer | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def scrape(self) -> str:
        families: list[Family] = []
        for collect in self._collectors:
            families += await collect()
        return render(families)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                request = await reader.readuntil(b"\r\n\r\n")
            parts = request.split(b" ", 2)
            if len(parts) == 3 and parts[0] == b"GET" and parts[1] == b"/metrics":
                body = (await self.scrape()).encode()
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            else:
                body, head = b"not found\n", b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
