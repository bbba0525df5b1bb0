"""Endpoints with named behaviours for pump tests (as Edge Hub's test endpoints: FailedEndpoint, ...)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from appliance.forwarding.endpoints import Refused, SendFailed
from appliance.forwarding.queues import QueuedMessage
from appliance.forwarding.window import LinkEstimate, Window

# How long a pump test waits for an event (a batch, an attempt) before it calls the pump stuck: a guard
# against a hang, not a bound on speed, so it is long enough for a test process starved at load 36.
WAIT_S = 30.0


class RecordingEndpoint:
    """Acknowledges everything; records each batch as (priority, [n, ...]).

    With ``hold_first`` the first batch stays "in flight" until ``release`` is set, so a test can add
    messages while a batch is out.
    """

    def __init__(self, batch_size: int = 3, hold_first: bool = False, fail_times: int = 0) -> None:
        self.id = "upstream"
        self.estimate = LinkEstimate(initial_messages=batch_size)
        self.batches: list[tuple[int, list[int]]] = []
        self.in_flight = asyncio.Event()
        self.release = asyncio.Event()
        self.hold_first = hold_first
        self.fail_times = fail_times
        self.attempts = 0
        self.changed = asyncio.Event()

    async def wait_ready(self) -> None:
        return None

    def window(self) -> Window:
        return self.estimate.window()

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        assert len({item.priority for item in batch}) == 1, "a batch never mixes priorities"
        self.attempts += 1
        if self.attempts <= self.fail_times:
            raise SendFailed("failing on purpose")
        if self.hold_first and not self.batches and not self.release.is_set():
            self.in_flight.set()
            await self.release.wait()
        self.batches.append((batch[0].priority, [int(item.message.app_property("n")) for item in batch]))
        self.changed.set()
        return len(batch)

    async def wait_for(self, count: int, timeout: float = WAIT_S) -> None:
        async def enough() -> None:
            while sum(len(b) for _, b in self.batches) < count:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(enough(), timeout)


class PreemptibleEndpoint(RecordingEndpoint):
    """Sends one message at a time and stops handing out the batch once ``preempt`` is set; the first
    message of the first batch stays in flight until ``release``."""

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        sent: list[int] = []
        for item in batch:
            if preempt.is_set():
                break
            sent.append(int(item.message.app_property("n")))
            if not self.batches and len(sent) == 1 and not self.release.is_set():
                self.in_flight.set()
                await self.release.wait()
        self.batches.append((batch[0].priority, sent))
        self.changed.set()
        return len(sent)


class RefusingEndpoint(RecordingEndpoint):
    """Refuses the messages whose ``n`` is in ``refuse`` - ``times`` times each (forever if None) - and
    acknowledges the others of the batch, before and after them, as an MQTT 5 broker answers a window of
    PUBLISHes with a PUBACK each."""

    def __init__(self, refuse: set[int], times: int | None = None, batch_size: int = 10) -> None:
        super().__init__(batch_size=batch_size)
        self.refuse = refuse
        self.times = times
        self.refused: list[int] = []

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        refused = [item for item in batch if int(item.message.app_property("n")) in self.refuse
                   and (self.times is None or self.refused.count(int(item.message.app_property("n"))) < self.times)]
        if not refused:
            return await super().send(batch, preempt)
        self.refused += [int(item.message.app_property("n")) for item in refused]
        acked = [item for item in batch if item not in refused]
        if acked:
            self.batches.append((batch[0].priority, [int(item.message.app_property("n")) for item in acked]))
            self.changed.set()
        raise Refused("Not authorized (0x87)", [item.seq for item in refused], [item.seq for item in acked])


def n_of(item: QueuedMessage) -> int:
    return int(item.message.app_property("n"))


class FaultyEndpoint(RecordingEndpoint):
    """Raises ``ValueError`` - not a ``SendFailed`` - for a batch holding a message whose ``n`` is in
    ``poison``, before sending anything: as paho's ``publish()`` raised on a ``#`` in a topic."""

    def __init__(self, poison: set[int], batch_size: int = 10) -> None:
        super().__init__(batch_size=batch_size)
        self.poison = poison

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        for item in batch:
            if n_of(item) in self.poison:
                raise ValueError(f"Publish topic cannot contain wildcards (message {n_of(item)})")
        return await super().send(batch, preempt)


class DroppingEndpoint(RecordingEndpoint):
    """A server that closes the connection when a message whose ``n`` is in ``poison`` reaches it, as
    mosquitto does on a control character or an oversized packet: the messages before it in the batch are
    acknowledged, it and those after it were in flight when the link dropped.

    ``hold_after``: after that many drops the next batch stays in flight until the pump is stopped, so a
    test that waits for a count of drops sees that count and no more (the pump retries within 10-20 ms,
    sooner than a poll on a loaded machine looks again)."""

    def __init__(self, poison: set[int], batch_size: int = 10, hold_after: int | None = None) -> None:
        super().__init__(batch_size=batch_size)
        self.poison = poison
        self.hold_after = hold_after
        self.drops: list[list[int]] = []  # the messages in flight at each drop

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        if self.hold_after is not None and len(self.drops) >= self.hold_after:
            await asyncio.Event().wait()  # in flight until the pump's stop cancels it
        for index, item in enumerate(batch):
            if n_of(item) in self.poison:
                acked = batch[:index]
                if acked:
                    self.batches.append((batch[0].priority, [n_of(i) for i in acked]))
                self.drops.append([n_of(i) for i in batch[index:]])
                self.changed.set()
                raise SendFailed("upstream connection lost: Unspecified error", [i.seq for i in acked],
                                 [i.seq for i in batch[index:]], link_dropped=True)
        return await super().send(batch, preempt)


class BrokenWindowEndpoint(RecordingEndpoint):
    """``window()`` raises for its first ``failures`` calls: a fault outside any one message, which only
    the supervisor can get over. ``running_seen`` records whether the pump said it ran at each call."""

    def __init__(self, failures: int) -> None:
        super().__init__(batch_size=10)
        self.failures = failures
        self.running: Callable[[], bool] = lambda: True
        self.running_seen: list[bool] = []

    def window(self) -> Window:
        self.running_seen.append(self.running())
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a bug outside any one message")
        return super().window()
