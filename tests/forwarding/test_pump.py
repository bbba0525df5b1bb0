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
from testing import waiting
from testing.fake_runtime import FakeRuntime
from tests.forwarding.endpoints_for_tests import (
    WAIT_S,
    BrokenWindowEndpoint,
    DroppingEndpoint,
    FaultyEndpoint,
    PreemptibleEndpoint,
    RecordingEndpoint,
    RefusingEndpoint,
)

UP = Endpoint("upstream")


def metrics_of(pump: Pump) -> ForwardingMetrics:
    return pump.metrics


def msg(n: int) -> Message:
    return Message("/messages/events", "devices/d/messages/events", b"x" * 20, "d", properties=[("n", str(n))])


async def _with_pump(tmp_path: Path, endpoint: RecordingEndpoint, scenario, fake_clock: bool = False,
                     **options: float) -> ForwardingMetrics:
    """``fake_clock``: the pump's backoffs on a ``FakeRuntime`` (``pump.runtime``) that the scenario moves."""
    thread = StoreThread("test-store")
    store = MessageStore(tmp_path / "forwarding.db")
    metrics = ForwardingMetrics()
    runtime = FakeRuntime.on_running_loop() if fake_clock else None
    pump = Pump(endpoint, store, thread, metrics, retry_min_s=0.01, retry_max_s=0.02,  # type: ignore[arg-type]
                runtime=runtime, **options)

    async def add(n: int, priority: int, ttl: int = 60) -> int:
        """Store message ``n``; its sequence number."""
        seq, _ = await thread.call(store.add, msg(n), [RouteResult(UP, priority, ttl)])
        pump.notify(priority)
        return seq

    try:
        await scenario(pump, add, store, thread)
    finally:
        if pump.task is not None:
            pump.stop()
            await asyncio.gather(pump.task, return_exceptions=True)
        await thread.call(store.close)
        thread.shutdown()
    return metrics


async def send_six_at_priority_9(pump: Pump, add, endpoint: RecordingEndpoint) -> None:
    """Messages 0-5 stored at priority 9, then the pump started: returns once the first batch is out."""
    for n in range(6):
        await add(n, 9)
    pump.start()
    await asyncio.wait_for(endpoint.in_flight.wait(), WAIT_S)


def test_highest_priority_first_and_restart_after_every_batch(tmp_path: Path) -> None:
    endpoint = RecordingEndpoint(batch_size=3, hold_first=True)

    async def scenario(pump: Pump, add, store, thread) -> None:
        await send_six_at_priority_9(pump, add, endpoint)
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
        await send_six_at_priority_9(pump, add, endpoint)
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
        await asyncio.wait_for(pump.wait_batches(1), WAIT_S)

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
        await asyncio.wait_for(pump.wait_batches(1), WAIT_S)
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
        await waiting.until(lambda: metrics_of(pump).counters["dead_lettered"][("upstream", 4)] == 1, WAIT_S)
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
        await asyncio.wait_for(pump.wait_batches(1), WAIT_S)  # its checkpoint, after the send
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
        await asyncio.wait_for(endpoint.in_flight.wait(), WAIT_S)
        blocker = sqlite3.connect(tmp_path / "forwarding.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        endpoint.release.set()
        await waiting.until(lambda: pump.store_failures >= 3, WAIT_S, "three failed checkpoints")
        assert pump.task is not None and not pump.task.done()
        blocker.execute("ROLLBACK")
        blocker.close()
        await asyncio.wait_for(pump.wait_batches(1), WAIT_S)
        assert await thread.call(store.message_count) == 0 and pump.store_failures == 0

    with caplog.at_level(logging.INFO, logger="appliance.forwarding.pump"):
        asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert len(endpoint.batches) >= 2 and all(ns == [1, 2] for _, ns in endpoint.batches)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "cannot be written" in lines[0] and "written again" in lines[1], lines


def delivered_ns(endpoint: RecordingEndpoint) -> list[int]:
    return sorted(n for _, ns in endpoint.batches for n in ns)


@pytest.mark.parametrize("batch_size", [1, 10])
def test_an_exception_on_one_message_dead_letters_it_and_the_pump_goes_on(
        tmp_path: Path, batch_size: int, caplog: pytest.LogCaptureFixture) -> None:
    """Before: ``run`` caught only ``sqlite3.Error``; paho's ``ValueError`` ended the pump task, with no
    log line, and a priority 0 alert published afterwards never left."""
    endpoint = FaultyEndpoint({2}, batch_size=batch_size)

    async def scenario(pump: Pump, add, store: MessageStore, thread) -> None:
        for n in range(5):
            await add(n, 3)
        pump.start()
        await waiting.until(lambda: pump.metrics.counters["dead_lettered"][("upstream", 3)] == 1, WAIT_S)
        await add(100, 0)
        await endpoint.wait_for(5)
        [letter] = await thread.call(store.dead_letters)
        assert letter.message.app_property("n") == "2" and letter.reason.startswith("ValueError: Publish topic")
        assert pump.task is not None and not pump.task.done() and pump.running and pump.state.restarts == 0

    with caplog.at_level(logging.WARNING, logger="appliance.forwarding.pump"):
        asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert delivered_ns(endpoint) == [0, 1, 3, 4, 100], "the others once each, the alert after"
    assert sum("moved to the dead letters" in r.getMessage() for r in caplog.records) == 1


def test_a_message_the_link_drops_on_is_dead_lettered_and_its_count_survives_a_restart(tmp_path: Path) -> None:
    """A server closes the connection on one message: before, the gateway reconnected and sent it again
    forever, and everything behind it at that priority waited for the TTL."""
    endpoint = DroppingEndpoint({2}, batch_size=5, hold_after=2)

    async def first_run(pump: Pump, add, store: MessageStore, thread) -> None:
        seqs = [await add(n, 2) for n in range(5)]
        pump.start()
        # Dropped with 2, 3, 4 in flight (2 is blamed, the first unacknowledged); then 2 alone.
        await waiting.until(lambda: len(endpoint.drops) == 2, WAIT_S)
        await waiting.until(lambda: store.link_drops("upstream", 2, seqs[2]) == 2, WAIT_S)

    asyncio.run(_with_pump(tmp_path, endpoint, first_run, max_link_drops=3))
    assert endpoint.drops == [[2, 3, 4], [2]]
    endpoint.hold_after = None

    async def after_restart(pump: Pump, add, store: MessageStore, thread) -> None:
        pump.start()
        await endpoint.wait_for(4)
        [letter] = await thread.call(store.dead_letters)
        assert letter.message.app_property("n") == "2" and "dropped 3 times" in letter.reason

    metrics = asyncio.run(_with_pump(tmp_path, endpoint, after_restart, max_link_drops=3))
    assert endpoint.drops == [[2, 3, 4], [2], [2]], "three drops in all, the restart in between"
    assert delivered_ns(endpoint) == [0, 1, 3, 4]
    assert metrics.counters["dead_lettered"][("upstream", 2)] == 1


def test_a_pump_whose_loop_fails_is_restarted_counted_and_reported_down(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    endpoint = BrokenWindowEndpoint(failures=2)

    async def scenario(pump: Pump, add, store, thread) -> None:
        endpoint.running = lambda: pump.running
        await add(1, 0)
        pump.start()
        await endpoint.wait_for(1)
        assert pump.state.restarts == 2 and pump.running

    with caplog.at_level(logging.ERROR, logger="appliance.forwarding.pump"):
        asyncio.run(_with_pump(tmp_path, endpoint, scenario, restart_min_s=0.01, restart_max_s=0.02))
    # The calls up to the one that got through; the pump may already have asked for its next window (a 4th
    # entry, up) before the scenario, woken by the delivery, stopped it.
    assert endpoint.running_seen[:3] == [True, False, False], "down from the failure until it read its queues"
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.ERROR]
    assert "starting it again" in caplog.records[0].getMessage()


def test_a_pump_task_that_ends_anyway_is_started_again(tmp_path: Path) -> None:
    endpoint = RecordingEndpoint(batch_size=10)

    async def scenario(pump: Pump, add, store, thread) -> None:
        runtime = pump.runtime
        assert isinstance(runtime, FakeRuntime)
        pump.start()
        first = pump.task
        assert first is not None
        await asyncio.sleep(0)
        first.cancel()  # not the service's stop: something else ended it
        await asyncio.gather(first, return_exceptions=True)
        assert not pump.running and pump.state.restarts == 1
        await runtime.elapse(4.999)
        assert pump.task is first  # not before its restart backoff
        await runtime.elapse(0.001)
        assert pump.task is not first
        await add(1, 0)
        await endpoint.wait_for(1)
        assert pump.running

    metrics = asyncio.run(_with_pump(tmp_path, endpoint, scenario, fake_clock=True, restart_min_s=5, restart_max_s=5))
    assert metrics.pumps["upstream"].restarts == 1


def test_a_sender_that_fails_on_every_message_goes_to_the_supervisor_not_the_dead_letters(tmp_path: Path) -> None:
    """A fault of the sender, not of the messages: after three messages in a row the pump is restarted
    (and reported down) rather than moving the whole queue to the dead letters."""
    endpoint = FaultyEndpoint(set(range(10)), batch_size=1)

    async def scenario(pump: Pump, add, store: MessageStore, thread) -> None:
        for n in range(10):
            await add(n, 5)
        pump.start()
        await waiting.until(lambda: pump.state.restarts == 1, WAIT_S)
        assert not pump.running
        assert len(await thread.call(store.dead_letters)) == 3

    asyncio.run(_with_pump(tmp_path, endpoint, scenario, restart_min_s=5, restart_max_s=5))


def test_an_entry_that_cannot_be_read_back_goes_to_the_dead_letters(tmp_path: Path) -> None:
    """A stored envelope that does not decode used to fail every read of its queue: the pump restarted on
    it forever and nothing behind it left."""
    endpoint = RecordingEndpoint(batch_size=10)

    async def scenario(pump: Pump, add, store: MessageStore, thread) -> None:
        seqs = [await add(n, 1) for n in range(4)]
        await thread.call(store.db.execute, "UPDATE messages SET envelope = '{\"source\": 1' WHERE seq = ?", (seqs[1],))
        pump.start()
        await endpoint.wait_for(3)
        [letter] = await thread.call(lambda: store.db.execute("SELECT seq, reason FROM dead_letters").fetchall())
        assert letter[0] == seqs[1] and "unreadable" in letter[1]
        assert pump.state.restarts == 0
        [listed] = await thread.call(store.dead_letters)  # what `appliance routes dead-letters` lists
        assert listed.seq == seqs[1] and listed.message.payload == b"x" * 20

    asyncio.run(_with_pump(tmp_path, endpoint, scenario))
    assert delivered_ns(endpoint) == [0, 2, 3]
