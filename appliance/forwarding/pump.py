"""The pump of one endpoint: highest priority first, one priority per batch, start over after every batch.

Theory of operation
-------------------
As in Edge Hub's ``StoringAsyncEndpointExecutor``: the endpoint has one queue per priority and a
checkpointer per queue (here: the last offset done, kept in memory and in the store). After every batch
the pump goes back to priority 0. Beyond Edge Hub, a batch is *preempted*: when a message of higher
priority is stored, the sender stops handing out the rest of the batch, the acknowledged prefix is
checkpointed and the pump starts over - so an alert waits for the messages already in flight, not for a
whole batch sized for yesterday's link. Low priorities can starve on a link too slow for the high ones; that is the
intended trade (Azure/iotedge's Route_priority_and_TTL.md says so).

Expired messages are never sent: the store skips them when reading, and a batch is filtered once more
right before it goes out (it may have waited for the link). A failed batch is sent again after a backoff,
less what the endpoint acknowledged of it. A message the endpoint itself refuses (MQTT 5 PUBACK reason
>= 0x80: not authorized, topic invalid, packet too large) would otherwise block its queue until it
expires: after ``max_refusals`` refusals it is moved to the store's dead letters with the reason (kept
for the operator, ``appliance routes dead-letters``). The refusals are counted in the store, next to the
checkpoints, so a restart does not start them over. A store that cannot be written (a full disk) does not
end the pump: the checkpoint is not taken, the batch is read and sent again after a backoff (at least
once: the endpoint may see it twice), and the failure is logged once, its end once.

Rules
-----
Nothing about one message may stop or stall the pump (docs/forwarding.md, "Store, pump, upstream"):

* A refused message is the only one retried: the messages of its batch the endpoint acknowledged, before
  it or after it, are taken off the queue (the checkpoint covers the acknowledged prefix, the others are
  deleted one by one), so they are delivered once.
* A message that cannot be sent to the endpoint at all (``Unsendable``: a string or a size its server
  must refuse) goes to the dead letters at once, with the reason.
* A server that closes the connection on a message (mosquitto does, on a control character in a user
  property or a packet above its ``max_packet_size``) shows as the link dropping while it is in flight.
  Every such drop is counted, in the store, against the first message in flight then (those before it
  were acknowledged; a server reads in order). If others were in flight behind it, it is sent alone next,
  so that the next drop names it alone - one round trip per drop, not the window sent one by one, which
  on a flaky satellite link would cost minutes per drop. A message alone in flight at its
  ``max_link_drops``-th drop goes to the dead letters with the reason, and the queue moves on. A
  delivery, an expiry or a dead letter forgets the count. Drops the gateway caused (a stop, the modem
  reporting the link down) blame nothing.
* A stored entry that cannot be read back (``UnreadableEntry``) goes to the dead letters with the reason.
* Any other exception while messages are handled: a batch of one moves that message to the dead letters
  with the exception as the reason (logged once, counted); a larger batch is sent again one message at a
  time, to find it (what already went out may go twice: at least once).
* The pump is supervised (``run``): if its loop fails anyway, it starts again after a backoff, counted
  (``restarts``), logged at ERROR, and reported not running (``running``) until it has read its queues
  again - the gateway stops feeding the systemd watchdog meanwhile, so a pump that stays down has the
  gateway restarted. A task that ends for any other reason is started again the same way.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Collection

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.backoff import Backoff
from appliance.forwarding.endpoints import EndpointSender, Refused, SendFailed, Unsendable
from appliance.forwarding.metrics import ForwardingMetrics, PumpState
from appliance.forwarding.queues import MessageStore, QueuedMessage, UnreadableEntry
from appliance.forwarding.routes import DEFAULT_PRIORITY
from appliance.runtime import Runtime, wall_ms
from appliance.store_thread import StoreThread

log = logging.getLogger(__name__)

PRIORITIES = tuple(range(DEFAULT_PRIORITY + 1))
#: Messages in a row that fail with an exception before the pump takes it for its own fault, not theirs.
MAX_FAULTS_IN_ROW = 3


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
        max_link_drops: int = 3,
        restart_min_s: float = 0.5,
        restart_max_s: float = 30.0,
        runtime: Runtime | None = None,
    ) -> None:
        """``on_checkpoint`` runs after every batch taken off a queue (the backlog LED follows the depth);
        a message the endpoint refuses ``max_refusals`` times goes to the dead letters, as does one alone
        in flight at the ``max_link_drops``-th drop of the link. Time (backoffs, the gap between batches,
        expiry) comes from ``runtime``."""
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self.sender = sender
        self.store = store
        self.thread = thread
        self.metrics = metrics
        self._retry = Backoff(retry_min_s, retry_max_s)
        self._restart = Backoff(restart_min_s, restart_max_s)
        self.on_checkpoint = on_checkpoint
        self.max_refusals = max_refusals
        self.max_link_drops = max_link_drops
        self.wake = asyncio.Event()
        self.preempt = asyncio.Event()
        self._sending_priority: int | None = None
        self.batches = 0
        self._batch_done = asyncio.Event()
        self._checkpoints: dict[int, int] = {}
        #: Per priority: up to which sequence number the queue is sent one message at a time (after a link
        #: drop or an exception with several messages out, so that the next failure names one message).
        self._one_by_one: dict[int, int] = {}
        self.task: asyncio.Task[None] | None = None
        self._stopped = False
        #: Store calls that failed in a row (0: the store works).
        self.store_failures = 0
        #: Messages dead-lettered for an exception since the last batch that went through.
        self._faults_in_row = 0
        self.state = metrics.pumps.setdefault(sender.id, PumpState())

    @property
    def running(self) -> bool:
        return self.state.running

    def start(self) -> None:
        self._stopped = False
        self.task = asyncio.create_task(self.run(), name=f"forwarding-pump-{self.sender.id}")
        self.task.add_done_callback(self._ended)

    def stop(self) -> None:
        """Cancel the pump for good (the service stops): it is not started again."""
        self._stopped = True
        if self.task is not None:
            self.task.cancel()

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The pump's task ended. ``run`` never returns and catches what its loop raises, so unless the
        service stopped it, it was cancelled from elsewhere or something escaped ``run``: it starts again
        after a backoff."""
        if self._stopped:
            return
        self.state.running = False
        self.state.restarts += 1
        delay = self._restart.next_delay()
        why = "cancelled" if task.cancelled() else repr(task.exception())
        log.error("endpoint %s: the pump ended (%s); starting it again in %.1f s (restart %d)", self.sender.id,
                  why, delay, self.state.restarts)
        self.runtime.call_later(delay, lambda: None if self._stopped else self.start())

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
            # Messages in flight at a link drop before a restart are sent one at a time, as before it.
            suspect = await self.thread.call(self.store.last_link_drop_suspect, self.sender.id, priority)
            if suspect:
                self._one_by_one[priority] = max(self._one_by_one.get(priority, 0), suspect)
        return self._checkpoints[priority]

    async def run(self) -> None:
        """The pump's loop, supervised: a store that fails is waited for; anything else that escapes the
        loop starts it over after a backoff, counted and logged at ERROR."""
        while True:
            try:
                await self._pump()
            except sqlite3.Error as exc:
                self.store_failures += 1
                if self.store_failures == 1:
                    log.warning("endpoint %s: the store cannot be written (%s); what was sent is sent again "
                                "once it can", self.sender.id, exc)
                await self.runtime.sleep(self._retry.next_delay())
            except Exception:
                self.state.running = False
                self.state.restarts += 1
                self._checkpoints.clear()  # read again from the store
                self._faults_in_row = 0
                delay = self._restart.next_delay()
                log.exception("endpoint %s: the pump failed; starting it again in %.1f s (restart %d)",
                              self.sender.id, delay, self.state.restarts)
                await self.runtime.sleep(delay)

    async def _read(self) -> tuple[int, list[QueuedMessage]]:
        """The next batch: of the highest priority that has messages waiting, and its priority. An entry
        that cannot be read back goes to the dead letters on the way."""
        window = self.sender.window()
        for priority in PRIORITIES:
            after = await self._checkpoint_of(priority)
            limit = window.messages
            if self._one_by_one.get(priority, 0) > after:
                limit = 1
            else:
                self._one_by_one.pop(priority, None)
            while True:
                try:
                    batch = await self.thread.call(self.store.read, self.sender.id, priority, after, limit, window.bytes)
                    break
                except UnreadableEntry as exc:
                    await self._dead_letter(priority, [exc.seq], exc.reason)
            if batch:
                return priority, batch
        return -1, []

    async def _pump(self) -> None:
        last_done: float | None = None  # when the previous batch was checkpointed, if a backlog followed
        while True:
            await self.sender.wait_ready()
            self.wake.clear()
            priority, batch = await self._read()
            self.state.running = True  # the queues could be read: up (again)
            if not batch:
                last_done = None
                self._restart.reset()
                await self.wake.wait()
                continue
            now_ms = wall_ms(self.runtime)
            live = [item for item in batch if item.expires_ms > now_ms]
            if last_done is not None:
                self.sender.estimate.note_gap(self.runtime.monotonic() - last_done)
            self.preempt.clear()
            self._sending_priority = priority
            try:
                count = await self.sender.send(live, self.preempt) if live else 0
            except SendFailed as exc:
                last_done = None
                if await self._failed(priority, batch, live, exc):
                    self._retry.reset()
                    continue
                self.metrics.count("retries", self.sender.id, priority, len(live))
                delay = self._retry.next_delay()
                log.info("endpoint %s: batch of %d failed (%s); retrying in %.2fs", self.sender.id, len(live), exc, delay)
                await self.runtime.sleep(delay)
                continue
            except Exception as exc:  # a fault while handling these messages: isolate it, never stop on it
                last_done = None
                await self._faulted(priority, live, exc)
                continue
            finally:
                self._sending_priority = None
            self._retry.reset()
            self._restart.reset()
            self._faults_in_row = 0
            if await self._complete(priority, batch, live, count):
                last_done = self.runtime.monotonic()

    async def _complete(self, priority: int, batch: list[QueuedMessage], live: list[QueuedMessage], count: int,
                        acked: Collection[int] = ()) -> bool:
        """Checkpoint what the first ``count`` messages of ``live`` finish: everything up to the last
        acknowledged one (expired ones in between included), or the whole batch; and take ``acked`` -
        messages acknowledged further on, after one that was not - off the queue one by one.
        False if nothing was done."""
        done = live[:count]
        done_seqs = {item.seq for item in done}
        beyond = sorted(seq for seq in acked if seq not in done_seqs)
        if count < len(live) and not done and not beyond:
            return False
        if count == len(live):
            offset = batch[-1].seq
        elif done:
            offset = done[-1].seq
        else:
            offset = await self._checkpoint_of(priority)
        sent, expired = await self.thread.call(self.store.checkpoint, self.sender.id, priority, offset,
                                               [*done_seqs, *beyond])
        if self.store_failures:
            log.info("endpoint %s: the store can be written again after %d failed attempts", self.sender.id,
                     self.store_failures)
            self.store_failures = 0
        self._checkpoints[priority] = offset  # the store forgot the refusals of what it checkpointed
        self.batches += 1
        self.state.head_moved_ms = wall_ms(self.runtime)
        self._batch_done.set()
        self.on_checkpoint()
        self.metrics.count("sent", self.sender.id, priority, sent)
        self.metrics.count("expired", self.sender.id, priority, expired)
        return True

    async def _failed(self, priority: int, batch: list[QueuedMessage], live: list[QueuedMessage], exc: SendFailed) -> bool:
        """Take what was acknowledged off the queue, then judge the failure. True if the queue moved on (a
        message went to the dead letters), so the next batch goes at once."""
        prefix = 0
        while prefix < len(live) and live[prefix].seq in exc.acked:
            prefix += 1
        await self._complete(priority, batch, live, prefix, exc.acked)
        if isinstance(exc, Unsendable):
            await self._dead_letter(priority, exc.seqs, exc.reason)
            return True
        if isinstance(exc, Refused):
            return await self._dead_letter_if_refused_enough(priority, exc)
        if exc.link_dropped and exc.in_flight:
            return await self._dead_letter_if_dropped_enough(priority, exc)
        return False

    async def _faulted(self, priority: int, live: list[QueuedMessage], exc: Exception) -> None:
        """An exception no sender should raise: dead-letter the one message it came from, or send the
        batch again one message at a time to find it. When ``MAX_FAULTS_IN_ROW`` messages in a row fail
        so, the fault is the pump's or the sender's, not theirs: it goes to the supervisor (restart with
        backoff, the watchdog unfed meanwhile) instead of moving the whole queue to the dead letters."""
        if len(live) == 1:
            self._faults_in_row += 1
            if self._faults_in_row > MAX_FAULTS_IN_ROW:
                raise RuntimeError(f"{self._faults_in_row} messages in a row failed to send") from exc
            log.error("endpoint %s: sending message %d of priority %d failed", self.sender.id, live[0].seq, priority,
                      exc_info=exc)
            await self._dead_letter(priority, [live[0].seq], f"{type(exc).__name__}: {exc}",
                                    f"failed with {type(exc).__name__}: {exc}")
            return
        log.warning("endpoint %s: sending %d messages of priority %d failed (%s: %s); sending them one at a time",
                    self.sender.id, len(live), priority, type(exc).__name__, exc)
        if live:
            self._one_by_one[priority] = max(self._one_by_one.get(priority, 0), live[-1].seq)

    async def _dead_letter(self, priority: int, seqs: list[int], reason: str, why: str = "") -> None:
        """Move ``seqs`` to the dead letters with ``reason``; one WARNING line says ``why`` (or the reason)."""
        moved = await self.thread.call(self.store.dead_letter, self.sender.id, priority, seqs, reason)
        self.metrics.count("dead_lettered", self.sender.id, priority, moved)
        self.state.head_moved_ms = wall_ms(self.runtime)
        self.on_checkpoint()
        log.warning("endpoint %s: %d messages of priority %d %s; moved to the dead letters", self.sender.id, moved,
                    priority, why or f"cannot be sent ({reason})")

    async def _dead_letter_if_refused_enough(self, priority: int, refused: Refused) -> bool:
        """Count the refusal; once a message has been refused ``max_refusals`` times, move the refused
        messages to the store's dead letters (with the reason) so the queue behind them moves on."""
        counts = await self.thread.call(self.store.count_refusals, self.sender.id, priority, refused.seqs)
        if max(counts.values(), default=0) < self.max_refusals:
            return False
        await self._dead_letter(priority, refused.seqs, refused.reason,
                                f"refused {self.max_refusals} times ({refused.reason})")
        return True

    async def _dead_letter_if_dropped_enough(self, priority: int, exc: SendFailed) -> bool:
        """Count the drop against the first message in flight (the messages before it were acknowledged);
        with others in flight behind it, send it alone next, so that the next drop names it alone. At
        its ``max_link_drops``-th drop, alone in flight, it goes to the dead letters."""
        head = min(exc.in_flight)
        counts = await self.thread.call(self.store.count_link_drops, self.sender.id, priority, [head])
        if len(exc.in_flight) > 1:
            self._one_by_one[priority] = max(self._one_by_one.get(priority, 0), head)
            return False
        if counts[head] < self.max_link_drops:
            return False
        reason = f"the link dropped {counts[head]} times while it was in flight, the last time alone ({exc.reason})"
        await self._dead_letter(priority, [head], reason, reason)
        return True
