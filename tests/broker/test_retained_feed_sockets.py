"""A large retained set delivered to a durable QoS 1 subscription does not freeze the broker for anyone
else (issue 12, item 7): real sockets, the broker on its own event-loop thread.

Before: the SUBSCRIBE of a durable QoS 1 subscriber matching 100,000 retained messages held the loop for
1.7 s. Now the set is handed over a slice per loop turn: no loop iteration spends more than
``ITERATION_BOUND`` of CPU, and another client's PINGREQ is answered all along. The bound is on the loop
thread's CPU time per iteration (``LoopStallMonitor``), what the broker controls: the round trips of the
pings are reported too, but on a shared two-core machine they also measure the OS scheduler (a ping took
170 ms once while no broker callback had run longer than 12 ms). The subscriber, which parses and
acknowledges every message, runs in its own process (this module run as a script), so it does not
compete with the broker for the GIL.

The broker stores the durable deliveries in a real ``broker.db``. CPU time leaves out the waits for the
disk: a commit that runs SQLite's WAL checkpoint can block the loop for 100-300 ms on the shared build
machine's disk whatever is being delivered, which is the store's cost, not the feed's.

The longest iteration is a full garbage collection (~40 ms with the broker's own heap: the 20,000
retained messages and their sessions), and a full collection walks every object of the process. In a
pytest-xdist worker that has run hundreds of tests before this one, that is the leftovers of all of them:
0.1 ms per 1,000 objects, 210 and 250 ms twice in four-worker runs, which measured the worker's history and
not the broker. So the heap the process had before the broker started is frozen (``gc.freeze``) for the
measurement: collections then walk what the broker and the clients allocate, as in the gateway's own
process, and the bound is the same in a fresh process and in a long-running worker.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance.broker.broker import Broker
from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from testing.inprocess import InProcessBroker
from tests.broker.clients import RawClient

#: The most CPU one loop iteration may take while the set is delivered, so no PINGREQ waits longer for
#: the loop. A feed's turn takes ~4 ms here; the longest iterations are the store's (a commit running the
#: WAL checkpoint: ~50 ms of CPU) and Python's full garbage collections (~25 ms). Before: 150 ms for
#: 20,000 messages, all in the SUBSCRIBE's iteration.
ITERATION_BOUND = 0.100


class LoopStallMonitor:
    """Runs once per iteration of the broker's loop (a callback that re-schedules itself) and records the
    longest stretch of the loop thread's CPU time between two runs: the longest any client waited for the
    loop because of work it was doing."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._last = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, broker: Broker) -> None:
        self._loop = asyncio.get_running_loop()
        self._last = time.thread_time()
        self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        now = time.thread_time()
        self.worst = max(self.worst, now - self._last)
        self._last = now
        assert self._loop is not None
        self._loop.call_soon(self._tick)
REPO = Path(__file__).resolve().parents[2]


def subscribe_and_acknowledge(port: int, expected: int) -> None:
    """The subscriber process: a durable QoS 1 subscription to ``r/#``; acknowledge every message; print
    "ok" if ``expected`` of them came, oldest topic first, then exit."""
    client = RawClient(port)
    client.connect("subscriber", clean_start=False, properties={pr.SESSION_EXPIRY_INTERVAL: 3600})
    client.send(pk.Subscribe(1, [pk.SubscribeRequest("r/#", 1)]))
    print("subscribed", flush=True)
    topics: list[str] = []
    while len(topics) < expected:
        packet = client.recv()
        if isinstance(packet, pk.Publish):
            topics.append(packet.topic)
            if packet.qos == 1 and packet.packet_id is not None:
                client.send(pk.PubAck(packet.packet_id))
    client.send(pk.Disconnect())
    print("ok" if topics == [f"r/{i}" for i in range(expected)] else f"out of order: {topics[:5]}", flush=True)


def pings_during_delivery(data_dir: Path, retained: int, full_collection: bool = False) -> tuple[float, list[float]]:
    """Retain ``retained`` messages, start the subscriber process, ping until it has them all; returns the
    longest loop iteration (CPU seconds) and every ping's round trip. The process's heap from before is out
    of the garbage collector's sight meanwhile (module docstring); ``full_collection`` runs one on the loop
    while the set is delivered."""
    gc.freeze()
    try:
        return _pings_during_delivery(data_dir, retained, full_collection)
    finally:
        gc.unfreeze()


def _pings_during_delivery(data_dir: Path, retained: int, full_collection: bool) -> tuple[float, list[float]]:
    monitor = LoopStallMonitor()
    with InProcessBroker(data_dir, before_listen=monitor.install) as hosted:

        async def fill(first: int, stop: int) -> None:
            for index in range(first, stop):
                hosted.broker.publish(f"r/{index}", b"state", qos=1, retain=True)
            hosted.broker.flush()  # commit them now, before the monitor starts counting

        for first in range(0, retained, 10_000):  # in calls that each end well within their 10 s
            hosted.call(fill(first, min(first + 10_000, retained)))
        monitor.worst = 0.0  # filling the store is set-up
        pinger = RawClient(hosted.port)
        pinger.connect("pinger")
        subscriber = subprocess.Popen(
            [sys.executable, "-m", __spec__.name, str(hosted.port), str(retained)], cwd=REPO, stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert subscriber.stdout is not None
            assert subscriber.stdout.readline().strip() == "subscribed"
            if full_collection:
                hosted.loop.call_soon_threadsafe(gc.collect)
            round_trips: list[float] = []
            while subscriber.poll() is None:
                started = time.perf_counter()
                pinger.send(pk.PingReq())
                pinger.expect(pk.PingResp)
                round_trips.append(time.perf_counter() - started)
                time.sleep(0.005)  # the probe's pace, not synchronisation
            assert subscriber.stdout.read().strip() == "ok"
            assert subscriber.returncode == 0
        finally:
            subscriber.kill()
            subscriber.wait(10)
            pinger.close()
        return monitor.worst, round_trips


def test_no_loop_iteration_stalls_while_20000_retained_messages_are_delivered(tmp_path: Path) -> None:
    worst, round_trips = pings_during_delivery(tmp_path, 20_000)
    assert len(round_trips) >= 10
    assert worst < ITERATION_BOUND, (worst, [round(t * 1000) for t in sorted(round_trips)[-5:]])


def test_a_full_collection_during_delivery_costs_the_brokers_heap_not_what_earlier_tests_left(tmp_path: Path) -> None:
    """The bound holds in a worker whose earlier tests left a large heap: a full collection on the loop
    walks 1.5 million objects in ~150 ms (over the bound) unless that heap is out of the measurement."""
    leftovers = [[number] for number in range(1_500_000)]
    worst, _ = pings_during_delivery(tmp_path, 2_000, full_collection=True)
    assert len(leftovers) == 1_500_000  # alive until the measurement is over
    assert worst < ITERATION_BOUND, worst


@pytest.mark.slow
def test_no_loop_iteration_stalls_while_100000_retained_messages_are_delivered(tmp_path: Path) -> None:
    worst, round_trips = pings_during_delivery(tmp_path, 100_000)
    assert worst < ITERATION_BOUND, (worst, [round(t * 1000) for t in sorted(round_trips)[-5:]])


if __name__ == "__main__":
    subscribe_and_acknowledge(int(sys.argv[1]), int(sys.argv[2]))
