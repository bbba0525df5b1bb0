"""The socket layer (``server.py``), on uvloop as the gateway runs it: read fairness, and the CONNECT
timeout.

A flooding publisher must not be read faster than one small read per loop iteration: that bound is what
keeps one client's flood from delaying everyone else's messages. The test counts loop iterations with a
callback that re-schedules itself (one run per iteration) and records which iteration each read of the
flooding connection happened in; it asserts the structure, not a time.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop

from appliance.broker.broker import Broker
from appliance.broker.codec import packets as pk
from appliance.broker.codec.writer import encode
from appliance.broker.transport import server
from appliance.broker.transport.server import READ_BUFFER_BYTES, ClientProtocol, ConnectDeadlines
from testing.inprocess import InProcessBroker
from tests.broker.clients import RawClient


class ReadRecorder:
    """Records the broker's reads as (loop iteration, client id, bytes); a callback that re-schedules
    itself counts the loop's iterations (one run per iteration)."""

    def __init__(self) -> None:
        self.iteration = 0
        self.reads: list[tuple[int, str, int]] = []

    def install(self, broker: Broker) -> None:
        handle = broker.data_received

        def recording(link: ClientProtocol, data: bytes) -> int:
            self.reads.append((self.iteration, link.connection.client_id, len(data)))
            return handle(link, data)

        broker.data_received = recording  # type: ignore[method-assign]
        self._tick()

    def _tick(self) -> None:
        self.iteration += 1
        asyncio.get_running_loop().call_soon(self._tick)


class RecordingBroker(InProcessBroker):
    """A broker on a uvloop thread, as the gateway runs it, whose reads are recorded."""

    def __init__(self) -> None:
        self.recorder = ReadRecorder()
        super().__init__(None, loop=uvloop.new_event_loop(), before_listen=self.recorder.install)

    @property
    def reads(self) -> list[tuple[int, str, int]]:
        return self.recorder.reads


@pytest.fixture
def recording() -> Iterator[RecordingBroker]:
    with RecordingBroker() as broker:
        yield broker


def test_a_flooding_client_gets_one_small_read_per_loop_iteration(recording: RecordingBroker) -> None:
    """Version-free: the socket layer reads bytes before any packet is parsed (3.1.1 and 5 alike)."""
    subscriber = RawClient(recording.port)
    subscriber.connect("subscriber")
    subscriber.subscribe("flood", 0)
    flooder = RawClient(recording.port)
    flooder.connect("flooder")
    count = 5000
    flooder.sock.sendall(encode(pk.Publish("flood", b"x" * 64), 5) * count)  # about 400 KB at once
    flooder.send(pk.PingReq())
    flooder.expect(pk.PingResp, timeout=30)
    payloads = 0
    while payloads < count:
        packet = subscriber.recv()
        assert isinstance(packet, pk.Publish) and packet.payload == b"x" * 64
        payloads += 1

    reads = [(iteration, size) for iteration, client, size in recording.reads if client == "flooder"]
    assert max(size for _, size in reads) <= READ_BUFFER_BYTES
    full_reads_per_iteration = Counter(iteration for iteration, size in reads if size == READ_BUFFER_BYTES)
    assert full_reads_per_iteration, "the flood never filled a read buffer"
    assert max(full_reads_per_iteration.values()) == 1
    subscriber.close()
    flooder.close()


def test_a_large_publish_spanning_many_reads_arrives_whole(recording: RecordingBroker, level: int) -> None:
    subscriber = RawClient(recording.port, level)
    subscriber.connect("big-subscriber")
    subscriber.subscribe("big", 1)
    publisher = RawClient(recording.port, level)
    publisher.connect("big-publisher")
    payload = bytes(range(256)) * 2000  # 512,000 bytes: 125 reads
    publisher.send(pk.Publish("big", payload, qos=1, packet_id=7))
    assert publisher.expect(pk.PubAck).packet_id == 7
    assert subscriber.expect(pk.Publish).payload == payload
    subscriber.close()
    publisher.close()


# -- the CONNECT timeout ---------------------------------------------------------------------------------


class FakeLoop:
    """``time`` and ``call_at``, the part of an event loop ``ConnectDeadlines`` uses; ``advance`` runs the
    timers that fall due, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], object]]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> Any:
        self.timers.append((when, callback))
        self.timers.sort(key=lambda timer: timer[0])
        return object()  # a handle; ConnectDeadlines never cancels it

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self.timers and self.timers[0][0] <= end:
            when, callback = self.timers.pop(0)
            self.now = max(self.now, when)
            callback()
        self.now = end


class Waiting:
    """A protocol's side of ``ConnectDeadlines``: records when its deadline passed."""

    def __init__(self, loop: FakeLoop, passed: list[tuple[str, float]], name: str) -> None:
        self.loop, self.passed, self.name = loop, passed, name

    def connect_deadline_passed(self) -> None:
        self.passed.append((self.name, self.loop.now))


def test_connect_deadlines_fire_each_connection_at_its_own_deadline_with_one_timer() -> None:
    loop = FakeLoop()
    deadlines = ConnectDeadlines(loop)  # type: ignore[arg-type]
    passed: list[tuple[str, float]] = []
    first, second, gone, third = (Waiting(loop, passed, name) for name in ("first", "second", "gone", "third"))
    deadlines.add(first)  # type: ignore[arg-type]
    loop.advance(3)
    deadlines.add(second)  # type: ignore[arg-type]
    deadlines.add(gone)  # type: ignore[arg-type]
    loop.advance(2)
    deadlines.add(third)  # type: ignore[arg-type]
    deadlines.discard(gone)  # type: ignore[arg-type]  # closed before its deadline
    assert len(loop.timers) == 1 and len(deadlines) == 3
    loop.advance(4.9)
    assert passed == []
    loop.advance(0.1)
    assert passed == [("first", 10.0)]
    loop.advance(10)
    assert passed == [("first", 10.0), ("second", 13.0), ("third", 15.0)]
    assert len(deadlines) == 0 and loop.timers == []
    deadlines.add(first)  # type: ignore[arg-type]  # empty again: the next arrival arms a timer again
    loop.advance(server.CONNECT_TIMEOUT)
    assert passed[-1] == ("first", 30.0)


UVLOOP_CLOCK_STEP_S = 0.002  # libuv's loop time: whole milliseconds of a coarse monotonic clock


def test_a_connection_without_connect_is_closed_at_the_timeout_and_one_with_connect_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "CONNECT_TIMEOUT", 0.5)
    with InProcessBroker(None, loop=uvloop.new_event_loop()) as hosted:
        connected = RawClient(hosted.port)
        connected.connect("has-connected", keep_alive=0)
        started = time.monotonic()
        silent = RawClient(hosted.port)
        with pytest.raises(ConnectionError):
            silent.recv(timeout=10)  # the server closes it: no CONNECT within the timeout
        # uvloop's clock is libuv's millisecond loop time, read at the poll's return, so the deadline
        # can fall a millisecond before our reading says; the fake-clock test above holds the exact time
        assert time.monotonic() - started >= 0.5 - UVLOOP_CLOCK_STEP_S
        connected.send(pk.PingReq())
        assert isinstance(connected.expect(pk.PingResp), pk.PingResp)
        connected.close()
