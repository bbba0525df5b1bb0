"""The least an MQTT relay in Python on uvloop can do per message: the floor of ``bench/wake_floor.py``.

    .venv/bin/python bench/minimal_relay.py      # prints "port N" once it listens on 127.0.0.1

Not a broker: it answers CONNECT with a CONNACK and SUBSCRIBE with a SUBACK (QoS 1 granted), forwards
every PUBLISH frame as it came to every connection that subscribed, acknowledges QoS 1 PUBLISHes with a
PUBACK, and ignores everything else (PUBACKs from subscribers included). No topics, sessions, windows,
store or checks. Built like our gateway's socket layer (an ``asyncio.BufferedProtocol`` with a 4 KiB
buffer on uvloop, ``gc.freeze()`` after start-up), so what it costs per message at a low rate is what
Python and uvloop cost for a wake-up, a read and two writes, with next to no Python of its own between
them (issue 30, session 13: the floor under the broker's per-wake cost).
"""

from __future__ import annotations

import asyncio
import gc

import uvloop

READ_BUFFER_BYTES = 4096


class RelayProtocol(asyncio.BufferedProtocol):
    """One connection; ``subscribers`` is shared by every connection of the relay."""

    def __init__(self, subscribers: list[RelayProtocol]) -> None:
        self.subscribers = subscribers
        self.buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        self.rest = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.subscribers:
            self.subscribers.remove(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = self.rest + bytes(self.buffer[:nbytes]) if self.rest else bytes(self.buffer[:nbytes])
        transport = self.transport
        assert transport is not None
        forwarded: list[bytes] = []
        acks: list[bytes] = []
        pos, end = 0, len(data)
        while end - pos >= 2:
            length, start, shift = 0, pos + 1, 0
            while start < end:
                byte = data[start]
                start += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            else:
                break
            if start + length > end:
                break
            kind = data[pos] & 0xF0
            if kind == 0x30:  # PUBLISH: forward the frame; QoS 1 gets a PUBACK with its packet id
                forwarded.append(data[pos:start + length])
                if data[pos] & 0x06:
                    id_at = start + 2 + (data[start] << 8 | data[start + 1])
                    acks.append(b"\x40\x02" + data[id_at:id_at + 2])
            elif kind == 0x10:  # CONNECT: accepted
                transport.write(b"\x20\x03\x00\x00\x00")
            elif kind == 0x80:  # SUBSCRIBE: QoS 1 granted, whatever was asked
                self.subscribers.append(self)
                transport.write(b"\x90\x04" + data[start:start + 2] + b"\x00\x01")
            pos = start + length
        self.rest = data[pos:]
        if forwarded:
            frames = b"".join(forwarded)
            for subscriber in self.subscribers:
                if subscriber.transport is not None:
                    subscriber.transport.write(frames)
        if acks:
            transport.write(b"".join(acks))


async def serve() -> None:
    loop = asyncio.get_running_loop()
    subscribers: list[RelayProtocol] = []
    server = await loop.create_server(lambda: RelayProtocol(subscribers), "127.0.0.1", 0)
    gc.freeze()
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve())
