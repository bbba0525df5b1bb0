"""The userspace relay over real sockets: rate, delay, jitter, loss, DOWN/UP, cut, and the thread wrapper."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time

import pytest

from hil_tests.rig.relay import Relay, RelayThread
from hil_tests.rig.shaping import MIN_BURST_BYTES, WIRE_HEADER_BYTES, WIRE_PAYLOAD_BYTES, SettingsError
from hil_tests.rig.tests.peers import MeasuredRate, echo_server, flood, measured_rate_bps, sink_server
from testing import run_queue


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> float:
    loop = asyncio.get_running_loop()
    sent = loop.time()
    writer.write(payload)
    await writer.drain()
    assert await reader.readexactly(len(payload)) == payload
    return loop.time() - sent


WINDOW_S = 2.0


@pytest.mark.parametrize("rate_bps", [64_000, 9_600])
def test_throughput_follows_the_rate_within_15_percent(rate_bps):
    """RATE counts frames on the wire, as tc does on the netns backend: payload goodput is RATE x 1448/1514.

    The relay, the flooding sender and the sink share this thread's event loop. On a busy machine the
    thread waits for a CPU now and then, while a tbf in the kernel would go on sending. The bucket credits
    the link time lost to a late timer, and an idle bucket banks up to one burst, so a wait costs the link
    nothing unless it lasts longer than a burst at the rate; one that does (the relay could not read the
    socket meanwhile) shifts at most its excess out of the window, or caught up into it. The kernel counts
    the thread's waits (``run_queue``); the sum of the excesses of several waits is at most the total less
    one burst's time, and that, as a share of the window, widens the 15 %. On a quiet machine it is 0.
    """
    async def scenario() -> MeasuredRate:
        async with sink_server() as sink, Relay("127.0.0.1", sink.port) as relay:
            relay.set(rate_bps=rate_bps)
            return await measured_rate_bps(sink, "127.0.0.1", relay.port, seconds=WINDOW_S)

    with run_queue.sampling(os.getpid(), threading.get_native_id()) as cpu_wait:
        measured = asyncio.run(scenario())
    waited = cpu_wait.between(measured.first_byte, measured.end)
    shifted = max(0.0, waited - MIN_BURST_BYTES * 8 / rate_bps) / WINDOW_S
    goodput = rate_bps * WIRE_PAYLOAD_BYTES / (WIRE_PAYLOAD_BYTES + WIRE_HEADER_BYTES)
    assert goodput * (0.85 - shifted) <= measured.bits_per_second <= goodput * (1.15 + shifted), (measured, waited)


def test_a_relay_starved_of_cpu_catches_up_the_link_time_it_lost():
    """tbf's dequeue timer is in the kernel and keeps sending while the program that set the rate gets no
    CPU; the userspace relay must deliver the same: a second without CPU (here its loop is blocked, the
    sink's with it) is caught up once it runs again, not lost beyond the bucket's 0.2 s burst."""
    starved_s, window_s, rate_bps = 1.0, 2.5, 64_000

    async def scenario() -> tuple[int, float, float]:
        async with sink_server() as sink, Relay("127.0.0.1", sink.port) as relay:
            relay.set(rate_bps=rate_bps)
            loop = asyncio.get_running_loop()
            sender = asyncio.ensure_future(flood("127.0.0.1", relay.port))
            try:
                assert sink.first_byte is not None
                first = await asyncio.wait_for(asyncio.shield(sink.first_byte), 10)
                await asyncio.sleep(first + 0.3 - loop.time())  # past the initial burst: the flood waits for tokens
                start, started_at = loop.time(), time.time()
                time.sleep(starved_s)  # the relay's loop gets no CPU: the input of this test, not a wait
                await asyncio.sleep(start + window_s - loop.time())
                return sink.bytes_between(start, start + window_s), started_at, time.time()
            finally:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await sender

    # As in the test above: the time this thread (relay, flood and sink) waited for a CPU on top of the
    # starvation the test makes is the machine's load; beyond a burst's time it shifts bytes out of the window.
    with run_queue.sampling(os.getpid(), threading.get_native_id()) as cpu_wait:
        delivered, started_at, ended_at = asyncio.run(scenario())
    waited = cpu_wait.between(started_at, ended_at)
    shifted = max(0.0, waited - MIN_BURST_BYTES * 8 / rate_bps) / window_s
    goodput_bytes = rate_bps / 8 * WIRE_PAYLOAD_BYTES / (WIRE_PAYLOAD_BYTES + WIRE_HEADER_BYTES)
    assert goodput_bytes * window_s * (0.85 - shifted) <= delivered <= goodput_bytes * window_s * (1.15 + shifted), (
        delivered, goodput_bytes * window_s, waited)


def test_delay_is_added_to_each_direction():
    """At least the two delays, and not much more: what this thread (relay, echo and client) waited for a CPU
    during the delayed round trip is the machine's load, not the relay's delay."""
    async def scenario() -> tuple[float, float, float, float]:
        async with echo_server() as port, Relay("127.0.0.1", port) as relay:
            reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            baseline = await _round_trip(reader, writer, b"ping")
            relay.set(delay_ms=150)
            sent_at = time.time()
            delayed = await _round_trip(reader, writer, b"ping")
            answered_at = time.time()
            writer.close()
            return baseline, delayed, sent_at, answered_at

    with run_queue.sampling(os.getpid(), threading.get_native_id()) as cpu_wait:
        baseline, delayed, sent_at, answered_at = asyncio.run(scenario())
    waited = cpu_wait.between(sent_at, answered_at)
    assert delayed >= 0.300
    assert delayed - baseline - waited < 0.300 + 0.250, (delayed, baseline, waited)


def test_jitter_spreads_latency_without_reordering_the_stream():
    async def scenario() -> list[float]:
        async with sink_server() as sink, Relay("127.0.0.1", sink.port, seed=7) as relay:
            relay.set(delay_ms=100, jitter_ms=80)
            loop = asyncio.get_running_loop()
            _, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            sent_at = []
            for index in range(15):
                sent_at.append(loop.time())
                writer.write(b"%02d" % index)
                await writer.drain()
                await asyncio.sleep(0.03)  # pacing the sender so each message is its own segment
            await sink.received(30)
            writer.close()
            assert bytes(sink.data) == b"".join(b"%02d" % i for i in range(15))
            arrivals = [t for t, n in sink.arrivals for _ in range(n // 2)]
            return [arrived - sent for arrived, sent in zip(arrivals, sent_at, strict=True)]

    latencies = asyncio.run(scenario())
    assert min(latencies) >= 0.019
    assert max(latencies) < 0.180 + 0.2
    assert max(latencies) - min(latencies) > 0.04


def test_loss_costs_a_retransmission_timeout_and_loses_no_bytes():
    async def scenario() -> list[float]:
        async with echo_server() as port, Relay("127.0.0.1", port, seed=3) as relay:
            relay.set(loss_pct=30)
            reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            times = [await _round_trip(reader, writer, b"message %d" % i) for i in range(10)]
            writer.close()
            return times

    times = asyncio.run(scenario())
    assert any(t >= 0.2 for t in times), times
    assert any(t < 0.15 for t in times), times


def test_down_stalls_open_connections_refuses_new_ones_and_up_delivers_what_waited():
    async def scenario() -> None:
        async with echo_server() as port, Relay("127.0.0.1", port) as relay:
            reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            await _round_trip(reader, writer, b"before")
            relay.set(up=False)
            writer.write(b"during outage")
            await writer.drain()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.readexactly(13), 0.4)
            late_reader, late_writer = await asyncio.open_connection("127.0.0.1", relay.port)
            with pytest.raises(ConnectionError):
                if await late_reader.read(1) == b"":
                    raise ConnectionResetError("closed")
            late_writer.close()
            assert relay.stats().connections_refused == 1
            relay.set(up=True)
            assert await asyncio.wait_for(reader.readexactly(13), 5) == b"during outage"
            writer.close()

    asyncio.run(scenario())


def test_raising_the_rate_releases_segments_that_waited_under_the_old_rate():
    async def scenario() -> float:
        async with sink_server() as sink, Relay("127.0.0.1", sink.port) as relay:
            relay.set(rate_bps=800)  # 64-byte segments, 0.64 s each once the burst is spent
            _, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            writer.write(b"y" * 20_000)
            await writer.drain()
            await asyncio.wait_for(asyncio.shield(sink.first_byte), 5)
            assert len(sink.data) < 5_000
            loop = asyncio.get_running_loop()
            changed = loop.time()
            relay.set(rate_bps=0)
            await sink.received(20_000)
            writer.close()
            return loop.time() - changed

    assert asyncio.run(scenario()) < 1.0


def test_cut_resets_open_connections():
    async def scenario() -> None:
        async with echo_server() as port, Relay("127.0.0.1", port) as relay:
            reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            await _round_trip(reader, writer, b"hello")
            assert relay.cut() == 1
            with pytest.raises(ConnectionError):
                if await asyncio.wait_for(reader.read(1), 5) == b"":
                    raise ConnectionResetError("closed")
            writer.close()
            # The relay still accepts new connections after a cut.
            reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            await _round_trip(reader, writer, b"again")
            writer.close()

    asyncio.run(scenario())


def test_counters_report_bytes_each_way_and_current_throughput():
    async def scenario() -> None:
        async with echo_server() as port, Relay("127.0.0.1", port) as relay:
            reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            await _round_trip(reader, writer, b"a" * 1000)
            stats = relay.stats()
            assert stats.upstream.bytes_forwarded == 1000
            assert stats.downstream.bytes_forwarded == 1000
            assert stats.upstream.throughput_bps == 8000  # 1000 bytes within the last second
            assert (stats.connections_open, stats.connections_total) == (1, 1)
            writer.close()

    asyncio.run(scenario())


def test_invalid_settings_are_rejected_and_change_nothing():
    async def scenario() -> None:
        async with echo_server() as port, Relay("127.0.0.1", port) as relay:
            relay.set(rate_bps=9600)
            with pytest.raises(SettingsError, match="loss_pct"):
                relay.set(rate_bps=64000, loss_pct=100)
            with pytest.raises(SettingsError, match="unknown"):
                relay.set(rat_bps=1)
            assert relay.settings.rate_bps == 9600

    asyncio.run(scenario())


def test_relay_thread_serves_blocking_sockets_and_applies_set_before_returning():
    with socket.create_server(("127.0.0.1", 0)) as server, RelayThread("127.0.0.1", server.getsockname()[1]) as relay:
        client = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        upstream, _ = server.accept()
        upstream.settimeout(5)
        relay.set(delay_ms=200)
        assert relay.settings.delay_ms == 200
        started = time.monotonic()
        client.sendall(b"hi")
        assert upstream.recv(2) == b"hi"
        assert time.monotonic() - started >= 0.2
        assert relay.stats().upstream.bytes_forwarded == 2
        client.close()
        upstream.close()
