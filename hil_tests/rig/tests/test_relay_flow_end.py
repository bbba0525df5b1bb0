"""The relay ends a relayed flow when one of its ends closes or resets, as a user of the rig expects.

A FIN is forwarded as a half-close (the other side may still be reading, and gets every byte first); a
reset ends the whole flow at once, with what the relay still queued for it thrown away, so a flow nobody
can receive never spends the link's shared rate. The reset that matters most comes after a FIN: asyncio
stops watching a socket once it has read its EOF, so only the relay's own watch sees that socket break.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from hil_tests.rig.relay import Relay
from hil_tests.rig.shaping import MIN_BURST_BYTES, WIRE_HEADER_BYTES, WIRE_PAYLOAD_BYTES, wire_bytes
from hil_tests.rig.tests.peers import flood, reset_on_close
from testing import run_queue
from testing.waiting import until

Peer = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class _Target:
    """A target that hands every connection the relay makes to it to the test, in order."""

    port: int = 0
    accepted: asyncio.Queue[Peer] = field(default_factory=asyncio.Queue)

    async def next(self, timeout: float = 10.0) -> Peer:
        return await asyncio.wait_for(self.accepted.get(), timeout)


@contextlib.asynccontextmanager
async def _target() -> AsyncIterator[_Target]:
    target = _Target()

    async def hand_over(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await target.accepted.put((reader, writer))

    server = await asyncio.start_server(hand_over, "127.0.0.1", 0)
    target.port = server.sockets[0].getsockname()[1]
    try:
        yield target
    finally:
        server.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (``reset_on_close``)."""
    reset_on_close(writer.get_extra_info("socket"))
    writer.transport.abort()


# At 100 bit/s the relay moves 64-byte segments (68 bytes on the wire); a burst of 24 of them leaves the
# bucket empty, and the next segment 5.4 s later: a flow that ends sooner ended without spending tokens.
SLOW_RATE_BPS = 100
SLOW_BURST_SEGMENTS = 24
SLOW_BURST_PAYLOAD = SLOW_BURST_SEGMENTS * 64


def _slow_link(relay: Relay) -> None:
    relay.set(rate_bps=SLOW_RATE_BPS, burst_bytes=SLOW_BURST_SEGMENTS * wire_bytes(64))


async def _reset_ends_the_flow_at_once(relay: Relay, writer: asyncio.StreamWriter) -> None:
    """Reset ``writer``'s end: the relay closes the flow within 3 s and forwards no byte after the reset."""
    forwarded = relay.stats()
    _reset(writer)
    await until(lambda: relay.stats().connections_open == 0, timeout=3.0, what=lambda: f"flow closed: {relay.stats()}")
    after = relay.stats()
    assert (after.upstream.bytes_forwarded, after.downstream.bytes_forwarded) == (
        forwarded.upstream.bytes_forwarded, forwarded.downstream.bytes_forwarded)


@pytest.mark.parametrize("link", ["up", "down"])
@pytest.mark.parametrize("resetting_end", ["target", "client"])
def test_an_end_that_resets_after_its_fin_ends_the_flow_at_once(resetting_end, link):
    """One end half-closes (its FIN reaches the other end), then resets while the relay still has bytes
    for it waiting for tokens (the burst delivered, the next segment 5.4 s away). The relay must
    drop the flow at once: it used to see that reset only when it wrote the next segment (asyncio no
    longer reads a socket after its EOF), and a write that failed then ended only the deliverer, while
    the shaper went on spending the direction's tokens on a queue nobody would ever drain. A link that is
    DOWN stalls a flow but does not keep one whose end is gone."""

    async def scenario() -> None:
        async with _target() as target, Relay("127.0.0.1", target.port) as relay:
            _slow_link(relay)
            client_reader, client_writer = await asyncio.open_connection("127.0.0.1", relay.port)
            target_reader, target_writer = await target.next()
            if resetting_end == "target":
                leaving_reader, leaving, staying_reader, sender = target_reader, target_writer, client_reader, client_writer
            else:
                leaving_reader, leaving, staying_reader, sender = client_reader, client_writer, target_reader, target_writer
            sender.write(b"q" * 20_000)  # far more than the burst: most of it waits in the relay
            await sender.drain()
            await asyncio.wait_for(leaving_reader.readexactly(SLOW_BURST_PAYLOAD), 10)
            leaving.write_eof()
            assert await asyncio.wait_for(staying_reader.read(), 10) == b""  # the half-close went through
            relay.set(up=link == "up")
            await _reset_ends_the_flow_at_once(relay, leaving)
            sender.transport.abort()

    asyncio.run(scenario())


def test_a_flow_whose_destination_reset_leaves_the_whole_rate_to_the_next_one():
    """The rig's rate test, reduced: a flow at 9.6 kbit/s loses its destination (a FIN, then a reset, as a
    sink that closes with unread data), and the next flow must get the whole rate at once. The old relay
    kept the dead flow's shaper taking tokens for its never-drained queue: the next flow got about half.
    The allowance for a relay thread that waited for a CPU is test_relay's rate test's."""
    rate_bps, warmup_s, window_s = 9_600, 0.3, 2.0

    async def scenario() -> tuple[float, float, float]:
        async with _target() as target, Relay("127.0.0.1", target.port) as relay:
            relay.set(rate_bps=rate_bps)
            loop = asyncio.get_running_loop()
            senders = [asyncio.ensure_future(flood("127.0.0.1", relay.port))]
            try:
                first_reader, first_writer = await target.next()
                assert await asyncio.wait_for(first_reader.read(65536), 10)
                first_writer.write_eof()
                _reset(first_writer)
                senders.append(asyncio.ensure_future(flood("127.0.0.1", relay.port)))
                reader, _ = await target.next()
                assert await asyncio.wait_for(reader.read(65536), 10)
                start = loop.time() + warmup_s
                received = 0
                async with asyncio.timeout(start + window_s - loop.time()):
                    while True:
                        chunk = await reader.read(65536)
                        assert chunk, "the second flow ended"
                        if loop.time() >= start:
                            received += len(chunk)
            except TimeoutError:
                pass
            finally:
                for sender in senders:
                    sender.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                        await sender
            wall_offset = time.time() - loop.time()
            return received * 8 / window_s, start + wall_offset, start + window_s + wall_offset

    with run_queue.sampling(os.getpid(), threading.get_native_id()) as cpu_wait:
        measured, start, end = asyncio.run(scenario())
    shifted = max(0.0, cpu_wait.between(start, end) - MIN_BURST_BYTES * 8 / rate_bps) / window_s
    goodput = rate_bps * WIRE_PAYLOAD_BYTES / (WIRE_PAYLOAD_BYTES + WIRE_HEADER_BYTES)
    assert goodput * (0.85 - shifted) <= measured <= goodput * (1.15 + shifted), (measured, goodput)


def test_a_half_close_delivers_every_byte_then_the_fin_and_the_flow_ends_after_both():
    """The client sends and shuts its write side while the relay still holds most of its bytes (shaped);
    the target gets every byte, then EOF, and can still answer; the flow ends once both sides are done."""

    async def scenario() -> None:
        async with _target() as target, Relay("127.0.0.1", target.port) as relay:
            relay.set(rate_bps=256_000, delay_ms=50)
            client_reader, client_writer = await asyncio.open_connection("127.0.0.1", relay.port)
            payload = os.urandom(30_000)
            client_writer.write(payload)
            client_writer.write_eof()
            target_reader, target_writer = await target.next()
            assert await asyncio.wait_for(target_reader.read(), 10) == payload
            target_writer.write(b"got it")
            target_writer.write_eof()
            assert await asyncio.wait_for(client_reader.read(), 10) == b"got it"
            await until(lambda: relay.stats().connections_open == 0, timeout=3.0, what=lambda: f"flow closed: {relay.stats()}")
            assert relay.stats().upstream.bytes_forwarded == len(payload)
            client_writer.close()
            target_writer.close()

    asyncio.run(scenario())


def test_a_reset_while_both_directions_wait_for_tokens_ends_the_flow_at_once():
    """No FIN first: the target resets while asyncio still reads it, and both shapers wait for tokens
    (100 bit/s, bytes queued each way). asyncio sees the reset at once, but the shaper that reads that
    socket would raise it only at its next read, after its tokens: the flow ends at once all the same,
    and no byte moves after the reset."""

    async def scenario() -> None:
        async with _target() as target, Relay("127.0.0.1", target.port) as relay:
            _slow_link(relay)
            client_reader, client_writer = await asyncio.open_connection("127.0.0.1", relay.port)
            target_reader, target_writer = await target.next()
            client_writer.write(b"u" * 5_000)
            target_writer.write(b"d" * 5_000)
            await client_writer.drain()
            await target_writer.drain()
            for reader in (client_reader, target_reader):  # both bursts arrive; the rest waits for tokens
                await asyncio.wait_for(reader.readexactly(SLOW_BURST_PAYLOAD), 10)
            await _reset_ends_the_flow_at_once(relay, target_writer)
            client_writer.transport.abort()

    asyncio.run(scenario())



def test_a_segment_read_at_a_higher_rate_is_not_starved_by_another_flows_smaller_ones():
    """Segments pass a direction's bucket in the order they reached it, as through tbf's one queue. A
    segment read before RATE fell (64 kbit/s: 160 bytes) used to wait for the bucket to hold all of its
    bytes, which it never did while another flow took each 64-byte segment as soon as it fitted: the
    first flow stalled, and a flow whose destination had closed stayed open without ever writing the
    segment that would have shown its destination gone (the rig's rate test saw both)."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with _target() as target, Relay("127.0.0.1", target.port) as relay:
            relay.set(rate_bps=64_000)
            _, first_writer = await asyncio.open_connection("127.0.0.1", relay.port)
            first_writer.write(b"a" * 20_000)  # at 64 kbit/s for the time being: 160-byte segments
            first_reader, _ = await target.next()
            first_arrivals: list[float] = []
            arrived = asyncio.Event()

            async def record_first_flow() -> None:
                while await first_reader.read(65536):
                    first_arrivals.append(loop.time())
                    arrived.set()

            recorder = asyncio.ensure_future(record_first_flow())
            second = asyncio.ensure_future(flood("127.0.0.1", relay.port))
            try:
                await asyncio.wait_for(arrived.wait(), 10)
                relay.set(rate_bps=9_600)
                second_reader, _ = await target.next()
                assert await asyncio.wait_for(second_reader.read(65536), 10)  # the second flow runs...
                second_running = loop.time()
                async with asyncio.timeout(2.0):  # ...and the first one gets its turn all the same
                    while not first_arrivals or first_arrivals[-1] < second_running:
                        arrived.clear()
                        await arrived.wait()
            finally:
                for task in (second, recorder):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                        await task
            first_writer.transport.abort()

    asyncio.run(scenario())
