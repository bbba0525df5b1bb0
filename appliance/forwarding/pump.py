"""The pump of one endpoint: highest priority first, one priority per batch, start over after every batch.

As in Edge Hub's ``StoringAsyncEndpointExecutor``: the endpoint has one queue per priority and a
checkpointer per queue (here: the last offset done, kept in memory and in the store). After every batch
the pump goes back to priority 0. Beyond Edge Hub, a batch is *preempted*: when a message of higher
priority is stored, the sender stops handing out the rest of the batch, the acknowledged prefix is
checkpointed and the pump starts over - so an alert waits for the messages already in flight, not for a
whole batch sized for yesterday's link. Low priorities can starve on a link too slow for the high ones; that is the
intended trade (the spec says so).

Expired messages are never sent: the store skips them when reading, and a batch is filtered once more
right before it goes out (it may have waited for the link). A failed batch is read and sent again after a
backoff; it is not taken off its queue until the endpoint has acknowledged all of it. A message the
endpoint itself refuses (MQTT 5 PUBACK reason >= 0x80: not authorized, topic invalid, packet too large)
would otherwise block its queue until it expires: after ``max_refusals`` refusals it is moved to the
store's dead letters with the reason (kept for the operator, ``appliance routes dead-letters``). The
refusals are counted in the store, next to the checkpoints, so a restart does not start them over.
A store that cannot be written (a full disk) does not end the pump: the checkpoint is not taken, the
batch is read and sent again after a backoff (at least once: the endpoint may see it twice), and the
failure is logged once, its end once.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable

from appliance.backoff import Backoff
from appliance.forwarding.endpoints import EndpointSender, Refused, SendFailed
from appliance.forwarding.metrics import ForwardingMetrics
from appliance.forwarding.queues import MessageStore, QueuedMessage
from appliance.forwarding.routes import DEFAULT_PRIORITY
from appliance.store_thread import StoreThread

log = logging.getLogger(__name__)

PRIORITIES = tuple(range(DEFAULT_PRIORITY + 1))


class Pump:
    def __init__(
        self,
        sender: EndpointSender,
        store: MessageStore,
        thread: StoreThread,
        metrics: ForwardingMetrics,
        retry_min_s: float = 0.05,
        retry_max_s: float = 5.0,
        on_checkpoint: Callable[[], None] = lambda: None,
        max_refusals: int = 3,
    ) -> None:
        """``on_checkpoint`` runs after every batch taken off a queue (the backlog LED follows the depth);
        a message the endpoint refuses ``max_refusals`` times goes to the dead letters."""
        self.sender = sender
        self.store = store
        self.thread = thread
        self.metrics = metrics
        self._retry = Backoff(retry_min_s, retry_max_s)
        self.on_checkpoint = on_checkpoint
        self.max_refusals = max_refusals
        self.wake = asyncio.Event()
        self.preempt = asyncio.Event()
        self._sending_priority: int | None = None
        self.batches = 0
        self._batch_done = asyncio.Event()
        self._checkpoints: dict[int, int] = {}
        self.task: asyncio.Task[None] | None = None
        #: Store calls that failed in a row (0: the store works).
        self.store_failures = 0

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"forwarding-pump-{self.sender.id}")

    def notify(self, priority: int) -> None:
        """A message of ``priority`` was stored for this endpoint."""
        self.wake.set()
        if self._sending_priority is not None and priority < self._sending_priority:
            self.preempt.set()

    async def wait_batches(self, count: int) -> None:
        """Until ``count`` batches have been sent and checkpointed (for tests and the benchmark)."""
        while self.batches < count:
            self._batch_done.clear()
            await self._batch_done.wait()

    async def _checkpoint_of(self, priority: int) -> int:
        if priority not in self._checkpoints:
            self._checkpoints[priority] = await self.thread.call(self.store.checkpoint_of, self.sender.id, priority)
        return self._checkpoints[priority]

    async def run(self) -> None:
        while True:
            try:
                await self._pump()
            except sqlite3.Error as exc:
                self.store_failures += 1
                if self.store_failures == 1:
                    log.warning("endpoint %s: the store cannot be written (%s); what was sent is sent again "
                                "once it can", self.sender.id, exc)
                await asyncio.sleep(self._retry.next_delay())

    async def _pump(self) -> None:
        last_done: float | None = None  # when the previous batch was checkpointed, if a backlog followed
        while True:
            await self.sender.wait_ready()
            self.wake.clear()
            window = self.sender.window()
            batch = []
            priority = -1
            for priority in PRIORITIES:
                after = await self._checkpoint_of(priority)
                batch = await self.thread.call(self.store.read, self.sender.id, priority, after, window.messages, window.bytes)
                if batch:
                    break
            if not batch:
                last_done = None
                await self.wake.wait()
                continue
            now_ms = int(time.time() * 1000)
            live = [item for item in batch if item.expires_ms > now_ms]
            if last_done is not None:
                self.sender.estimate.note_gap(time.monotonic() - last_done)
            self.preempt.clear()
            self._sending_priority = priority
            try:
                count = await self.sender.send(live, self.preempt) if live else 0
            except SendFailed as exc:
                last_done = None
                if isinstance(exc, Refused):
                    await self._complete(priority, batch, live, exc.acked)
                    if await self._dead_letter_if_refused_enough(priority, exc):
                        self._retry.reset()
                        continue
                self.metrics.count("retries", self.sender.id, priority, len(live))
                delay = self._retry.next_delay()
                log.info("endpoint %s: batch of %d failed (%s); retrying in %.2fs", self.sender.id, len(live), exc, delay)
                await asyncio.sleep(delay)
                continue
            finally:
                self._sending_priority = None
            self._retry.reset()
            if await self._complete(priority, batch, live, count):
                last_done = time.monotonic()

    async def _complete(self, priority: int, batch: list[QueuedMessage], live: list[QueuedMessage], count: int) -> bool:
        """Checkpoint what the first ``count`` messages of ``live`` finish: everything up to the last
        acknowledged one (expired ones in between included), or the whole batch. False if nothing was."""
        done = live[:count]
        if not done and count < len(live):
            return False
        offset = done[-1].seq if count < len(live) else batch[-1].seq
        sent, expired = await self.thread.call(self.store.checkpoint, self.sender.id, priority, offset, [item.seq for item in done])
        if self.store_failures:
            log.info("endpoint %s: the store can be written again after %d failed attempts", self.sender.id,
                     self.store_failures)
            self.store_failures = 0
        self._checkpoints[priority] = offset  # the store forgot the refusals of what it checkpointed
        self.batches += 1
        self._batch_done.set()
        self.on_checkpoint()
        self.metrics.count("sent", self.sender.id, priority, sent)
        self.metrics.count("expired", self.sender.id, priority, expired)
        return True

    async def _dead_letter_if_refused_enough(self, priority: int, refused: Refused) -> bool:
        """Count the refusal; once a message has been refused ``max_refusals`` times, move the refused
        messages to the store's dead letters (with the reason) so the queue behind them moves on."""
        counts = await self.thread.call(self.store.count_refusals, self.sender.id, priority, refused.seqs)
        if max(counts.values(), default=0) < self.max_refusals:
            return False
        moved = await self.thread.call(self.store.dead_letter, self.sender.id, priority, refused.seqs, refused.reason)
        self.metrics.count("dead_lettered", self.sender.id, priority, moved)
        self.on_checkpoint()
        log.warning("endpoint %s: %d messages of priority %d refused %d times (%s); moved to the dead letters",
                    self.sender.id, moved, priority, self.max_refusals, refused.reason)
        return True
