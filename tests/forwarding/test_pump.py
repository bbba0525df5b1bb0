"""The pump against endpoints with named behaviours and a real SQLite store."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path

import pytest

from appliance.forwarding.messages import Message
from appliance.forwarding.metrics import ForwardingMetrics
from appliance.forwarding.pump import Pump
from appliance.forwarding.queues import MessageStore
from appliance.forwarding.routes import Endpoint, RouteResult
from appliance.store_thread import StoreThread
from tests.forwarding.endpoints_for_tests import (
    PreemptibleEndpoint,
    RecordingEndpoint,
    RefusingEndpoint,
)

UP = Endpoint("upstream")


def metrics_of(pump: Pump) -> ForwardingMetrics:
    return pump.metrics


async def until(condition, step_s: float = 0.005) -> None:
    """Until ``condition()`` holds, looked at every ``step_s`` (bounded by the caller's wait_for)."""
    while not condition():
        await asyncio.sleep(step_s)


def msg(n: int) -> Message:
    return Message("/messages/events", "devices/d/messages/events", b"x" * 20, "d", properties=[("n", str(n))])


async def _with_pump(tmp_path: Path, endpoint: RecordingEndpoint, scenario) -> ForwardingMetrics:
    thread = StoreThread("test-store")
    store = MessageStore(tmp_path / "forwarding.db")
    metrics = ForwardingMetrics()
    pump = Pump(endpoint, store, thread, metrics, retry_min_s=0.01, retry_max_s=0.02)

    async def add(n: int, priority: int, ttl: int = 60) -> None:
        await thread.call(store.add, msg(n), [RouteResult(UP, priority, ttl)])
        pump.notify(priority)

    try:
        await scenario(pump, add, store, thread)
    finally:
        if pump.task is not None:
            pump.task.cancel()
            await asyncio.gather(pump.task, return_exceptions=True)
        await thread.call(store.close)
        thread.shutdown()
    return metrics


def test_highest_priority_first_and_restart_after_every_batch(tmp_path: Path) -> None:
    endpoint = RecordingEndpoint(batch_size=3, hold_first=True)

    async def scenario(pump: Pump, add, store, thread) -> None:
        for n in range(6):
            await add(n, 9)
        pump.start()
        await asyncio.wait_for(endpoint.in_flight.wait(), 5)
        # While the first P9 batch is out, alerts arrive: they go before the rest of the P9 backlog.
        await add(100, 0)
        await add(101, 5)
        await add(102, 0)
        endpoint.release.set()
        await endpoint.wait_for(9)

    asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert endpoint.batches == [(9, [0, 1, 2]), (0, [100, 102]), (5, [101]), (9, [3, 4, 5])]


def test_a_higher_priority_preempts_the_rest_of_a_batch(tmp_path: Path) -> None:
    endpoint = PreemptibleEndpoint(batch_size=6)

    async def scenario(pump: Pump, add, store, thread) -> None:
        for n in range(6):
            await add(n, 9)
        pump.start()
        await asyncio.wait_for(endpoint.in_flight.wait(), 5)
        await add(100, 0)
        await add(101, 9)  # same priority as the batch: no preemption
        endpoint.release.set()
        await endpoint.wait_for(8)

    asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert endpoint.batches[:2] == [(9, [0]), (0, [100])]
    assert [n for _, ns in endpoint.batches[2:] for n in ns] == [1, 2, 3, 4, 5, 101]


def test_expired_messages_are_never_sent_and_counted(tmp_path: Path) -> None:
    endpoint = RecordingEndpoint(batch_size=10)

    async def scenario(pump: Pump, add, store, thread) -> None:
        await add(1, 2, ttl=1)
        await add(2, 2, ttl=60)
        store.clock = lambda: time.time() + 2  # two seconds later, as the store sees it
        pump.start()
        await asyncio.wait_for(pump.wait_batches(1), 5)

    metrics = asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert endpoint.batches == [(2, [2])]
    assert metrics.counters["sent"][("upstream", 2)] == 1
    assert metrics.counters["expired"][("upstream", 2)] == 1


def test_a_failed_batch_stays_queued_and_is_retried(tmp_path: Path) -> None:
    endpoint = RecordingEndpoint(batch_size=10, fail_times=2)

    async def scenario(pump: Pump, add, store, thread) -> None:
        await add(1, 0)
        await add(2, 0)
        pump.start()
        await asyncio.wait_for(pump.wait_batches(1), 5)
        assert await thread.call(store.message_count) == 0

    metrics = asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert endpoint.batches == [(0, [1, 2])]
    assert metrics.counters["retries"][("upstream", 0)] == 4


def test_a_message_refused_three_times_goes_to_the_dead_letters_and_the_queue_moves_on(tmp_path: Path) -> None:
    endpoint = RefusingEndpoint({2})

    async def scenario(pump: Pump, add, store: MessageStore, thread) -> None:
        for n in range(5):
            await add(n, 4)
        pump.start()
        await endpoint.wait_for(4)
        await asyncio.wait_for(until(lambda: metrics_of(pump).counters["dead_lettered"][("upstream", 4)] == 1), 5)
        letters = await thread.call(store.dead_letters)
        assert [d.message.app_property("n") for d in letters] == ["2"]
        assert await thread.call(store.message_count) == 0

    metrics = asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert endpoint.refused == [2, 2, 2]
    # The others of the batch, before and after the refused one, are acknowledged and taken off once.
    assert endpoint.batches == [(4, [0, 1, 3, 4])]
    assert metrics.counters["dead_lettered"][("upstream", 4)] == 1
    assert metrics.counters["sent"][("upstream", 4)] == 4


def test_a_refusal_that_clears_up_is_only_retried(tmp_path: Path) -> None:
    endpoint = RefusingEndpoint({0}, times=2)

    async def scenario(pump: Pump, add, store: MessageStore, thread) -> None:
        for n in range(3):
            await add(n, 1)
        pump.start()
        await endpoint.wait_for(3)
        assert await thread.call(store.dead_letters) == []
        await asyncio.wait_for(pump.wait_batches(1), 5)  # its checkpoint, after the send
        assert await thread.call(store.refusals, "upstream", 1, 1) == 0, "the count of a message that got through is forgotten"

    metrics = asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert endpoint.refused == [0, 0] and endpoint.batches == [(1, [1, 2]), (1, [0])]
    assert metrics.counters["dead_lettered"][("upstream", 1)] == 0


def test_a_store_that_cannot_be_written_does_not_end_the_pump(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The checkpoint after a batch fails (another writer holds the lock, as a full disk fails a write):
    the pump survives, sends the batch again (at least once), and checkpoints it once the store works."""
    endpoint = RecordingEndpoint(batch_size=10, hold_first=True)

    async def scenario(pump: Pump, add, store, thread) -> None:
        await add(1, 0)
        await add(2, 0)
        await thread.call(store.db.execute, "PRAGMA busy_timeout = 0")
        pump.start()
        await asyncio.wait_for(endpoint.in_flight.wait(), 5)
        blocker = sqlite3.connect(tmp_path / "forwarding.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        endpoint.release.set()
        while pump.store_failures < 3:
            await asyncio.sleep(0.01)
        assert pump.task is not None and not pump.task.done()
        blocker.execute("ROLLBACK")
        blocker.close()
        await asyncio.wait_for(pump.wait_batches(1), 5)
        assert await thread.call(store.message_count) == 0 and pump.store_failures == 0

    with caplog.at_level(logging.INFO, logger="appliance.forwarding.pump"):
        asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert len(endpoint.batches) >= 2 and all(ns == [1, 2] for _, ns in endpoint.batches)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "cannot be written" in lines[0] and "written again" in lines[1], lines
