"""The light load generator (``bench/broker_light.py``) counts exactly, over real sockets to our broker.

Its subscriber counts and acknowledges a read of same-size PUBLISHes with strided slices instead of a
frame walk, so a mistake there would silently inflate or deflate every figure it prints. Checked here: a
stream cut at every possible point is counted and acknowledged exactly as a frame walk does it, and
end to end every message a publisher sent is counted once, on the fast path (one payload size) and on the
walk (two sizes mixed), QoS 0 and QoS 1, against the real broker on uvloop.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import uvloop
from hypothesis import given
from hypothesis import strategies as st

from bench.broker_light import (
    Load,
    Publisher,
    Subscriber,
    connect,
    measure,
    pin,
    publish,
    subscribe,
    uniform_run,
    walk,
)
from testing.inprocess import InProcessBroker


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with InProcessBroker(Path(tmp_path_factory.mktemp("light")), loop=uvloop.new_event_loop()) as broker:
        yield broker


class Wire:
    """A transport that keeps what the client writes."""

    def __init__(self) -> None:
        self.written = bytearray()

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False


@given(
    packet_ids=st.lists(st.integers(1, 65535), min_size=1, max_size=30),
    sizes=st.lists(st.sampled_from([64, 64, 64, 200]), min_size=30, max_size=30),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=200),
)
def test_a_stream_cut_anywhere_is_counted_and_acknowledged_exactly(packet_ids: list[int], sizes: list[int],
                                                                    cuts: list[int]) -> None:
    frames = [publish("t/x", bytes(size), 1, packet_id) for packet_id, size in zip(packet_ids, sizes, strict=False)]
    frames.insert(len(frames) // 2, b"\xe0\x00")  # a DISCONNECT in between: not a PUBLISH, not counted
    stream = b"".join(frames)

    async def feed() -> tuple[int, bytes]:
        subscriber = Subscriber(b"", b"", (10**9, 10**9), lambda mark: None)
        wire = Wire()
        subscriber.transport = wire  # type: ignore[assignment]
        subscriber.handshaking = False
        at, index = 0, 0
        while at < len(stream):
            step = cuts[index % len(cuts)]
            subscriber.data_received(stream[at:at + step])
            at, index = at + step, index + 1
        return subscriber.received, bytes(wire.written)

    received, acks = asyncio.run(feed())
    assert received == len(packet_ids)
    assert acks == b"".join(b"\x40\x02" + packet_id.to_bytes(2, "big") for packet_id in packet_ids)


def test_a_run_of_equal_packets_is_counted_only_as_far_as_every_head_matches() -> None:
    ack = b"\x40\x02\x00\x01"
    assert uniform_run(ack * 3 + b"\x40", b"\x40\x02", 4) == 3
    assert uniform_run(ack + b"\x40\x03\x00\x01\x10" + ack, b"\x40\x02", 4) == 0  # a longer PUBACK: walk it
    frames, used = walk(ack + b"\x40\x03\x00\x01\x10" + b"\x40")
    assert [first for first, _, _ in frames] == [0x40, 0x40] and used == 9


async def exact_run(port: int, payload_sizes: list[int], qos: int, until: int) -> tuple[int, int, bool]:
    """Publishers (one per payload size) send until the subscriber has ``until`` messages, then stop; the
    subscriber is then waited for until it has everything that was sent (QoS 1: nothing is lost, so it
    gets there; a message counted twice would put it past ``sent``)."""
    loop = asyncio.get_running_loop()
    reached: asyncio.Future[None] = loop.create_future()

    def on_mark(mark: int) -> None:
        if not reached.done():
            reached.set_result(None)
    subscriber = Subscriber(connect("exact-sub", receive_maximum=64), subscribe("exact/t", qos), (until, until), on_mark)
    await loop.create_connection(lambda: subscriber, "127.0.0.1", port)
    await subscriber.ready
    publishers = [Publisher(connect(f"exact-pub{index}"), "exact/t", size, qos) for index, size in enumerate(payload_sizes)]
    for publisher in publishers:
        await loop.create_connection(lambda: publisher, "127.0.0.1", port)  # noqa: B023 - awaited at once
        await publisher.ready
        publisher.start()
    await asyncio.wait_for(reached, 30)
    for publisher in publishers:
        publisher.running = False
    sent = sum(publisher.sent for publisher in publishers)
    reached = loop.create_future()
    subscriber.marks = [sent]
    subscriber.count(0)
    if qos:
        await asyncio.wait_for(reached, 30)
    for client in [subscriber, *publishers]:
        assert client.transport is not None
        client.transport.close()
    return subscriber.received, sent, bool(subscriber.size)


@pytest.mark.parametrize("payload_sizes", [[64, 64], [64, 300]], ids=["one size, strided", "two sizes, walked"])
def test_every_qos1_message_sent_is_counted_once(hosted: InProcessBroker, payload_sizes: list[int]) -> None:
    received, sent, learned = uvloop.run(exact_run(hosted.port, payload_sizes, 1, 3000))
    assert received == sent >= 3000
    assert learned  # the strided path was armed; with two sizes it falls back to the walk


def test_qos0_fan_in_counts_no_more_than_was_sent(hosted: InProcessBroker) -> None:
    received, sent, _ = uvloop.run(exact_run(hosted.port, [64], 0, 3000))
    assert 3000 <= received <= sent


@pytest.mark.parametrize("load", [Load(0, messages=3000, warmup=500), Load(1, messages=3000, warmup=500),
                                  Load(1, messages=2000, warmup=500, durable=True),
                                  Load(1, publishers=1, messages=200, warmup=100, rate=2000.0)],
                         ids=["qos0_fanin", "qos1", "qos1_durable", "qos1_latency"])
def test_each_scenario_measures_a_rate_and_cpu_times(hosted: InProcessBroker, load: Load) -> None:
    result = uvloop.run(measure("127.0.0.1", hosted.port, psutil.Process(), load, "scenario"))
    assert result.messages == load.messages and result.rate > 0
    assert result.broker_cpu > 0 and result.generator_cpu > 0  # here both are this process's
    if load.rate is not None:
        assert len(result.latencies_ns) >= load.messages and min(result.latencies_ns) > 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs")
def test_pin_puts_every_thread_of_a_process_and_the_threads_it_starts_later_on_one_cpu() -> None:
    """``--pin``: a broker's threads all on the broker's CPU (a thread left out would run beside the
    generator), threads started after the pinning too."""
    cpu = max(os.sched_getaffinity(0))
    script = ("import sys, threading, os\n"
              "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
              "print(flush=True); sys.stdin.readline()\n"
              "later = threading.Thread(target=lambda: print(sorted(os.sched_getaffinity(0)), flush=True))\n"
              "later.start(); later.join(); sys.stdin.readline()\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdout.readline()  # both threads running
        tasks = os.listdir(f"/proc/{child.pid}/task")
        assert len(tasks) >= 2
        pin(child.pid, cpu)
        assert all(os.sched_getaffinity(int(task)) == {cpu} for task in tasks)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == f"[{cpu}]"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
