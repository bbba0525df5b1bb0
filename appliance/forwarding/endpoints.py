"""What the pump sends batches to: an ``EndpointSender``; and the brokered (module input) endpoint.

Every endpoint - the upstream bridge or a local module input - goes through the same queues and pump;
only ``send`` differs. ``send`` returns how many messages of the batch - a prefix - are acknowledged: all of
them, or fewer when ``preempt`` was set (a message of higher priority arrived) and the sender stopped
handing out the rest. On failure it raises ``SendFailed`` and the pump sends the batch again later
(at-least-once: the stable ``gw-message-id`` lets the receiver drop duplicates); ``Refused`` when the
endpoint itself said no to some messages, which the pump moves to the dead letters after a few refusals
instead of retrying them - and everything queued behind them - until they expire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Protocol

from appliance.broker.api import BrokerHandle
from appliance.forwarding.identity import gateway_properties
from appliance.forwarding.queues import QueuedMessage
from appliance.forwarding.routes import Endpoint
from appliance.forwarding.window import LinkEstimate, Window
from appliance.runtime import Runtime, wall_ms


class SendFailed(Exception):
    """The batch was not (entirely) acknowledged. ``acked``: the messages (sequence numbers) that were,
    wherever they sit in the batch - they are taken off the queue, the rest is sent again. ``in_flight``:
    the messages handed to the link and not answered when it failed; ``link_dropped``: the connection
    ended for no reason the gateway knows of (not a stop, not the modem going down) - the pump blames the
    messages in flight, as a server closes the connection on a message it cannot take."""

    def __init__(self, reason: str, acked: Iterable[int] = (), in_flight: Sequence[int] = (),
                 link_dropped: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.acked = set(acked)
        self.in_flight = list(in_flight)
        self.link_dropped = link_dropped


class Refused(SendFailed):
    """The endpoint answered, and refused (an MQTT 5 PUBACK reason code of 0x80 or more): ``seqs`` are the
    refused messages; ``acked`` those of the batch it acknowledged, before or after them."""

    def __init__(self, reason: str, seqs: Sequence[int] = (), acked: Iterable[int] = ()) -> None:
        super().__init__(f"refused: {reason}", acked)
        self.reason = reason
        self.seqs = list(seqs)


class Unsendable(SendFailed):
    """``seqs`` cannot be sent to this endpoint at all (a string or a size its server must refuse, or the
    client library would not encode them): the pump moves them to the dead letters at once."""

    def __init__(self, reason: str, seqs: Sequence[int], acked: Iterable[int] = ()) -> None:
        super().__init__(f"cannot be sent: {reason}", acked)
        self.reason = reason
        self.seqs = list(seqs)


class EndpointSender(Protocol):
    id: str
    estimate: LinkEstimate

    async def wait_ready(self) -> None:
        """Return once a batch can be attempted (the link is up)."""

    def window(self) -> Window:
        """How much the pump reads for the next batch."""

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        """Deliver a prefix of the batch (all of it unless ``preempt`` is set); return its length once
        all of it is acknowledged, else raise ``SendFailed``."""


def message_id(item: QueuedMessage, gateway_id: str) -> str:
    """Stable across retries and restarts (the sequence number is durable): the cloud's duplicate key."""
    return f"{gateway_id}:{item.seq}"


#: The device's system properties the one-message format forwards after its application properties, by the
#: user property names a device uses for them (``message-id``, ``content-encoding``; docs/message-format.md).
FORWARDED_SYSTEM_PROPERTIES = (
    ("content-encoding", "contentEncoding"),
    ("message-id", "messageId"),
    ("correlation-id", "correlationId"),
)


def identity_properties(item: QueuedMessage, gateway_id: str, sent_ms: int) -> list[tuple[str, str]]:
    """The ``gw-*`` user properties of docs/message-format.md, then the device's own, then the device's
    ``$.ce``, ``$.mid`` and ``$.cid`` (which the cloud needs to decode, deduplicate and correlate)."""
    m = item.message
    system = m.system_properties()
    return gateway_properties(
        message_id(item, gateway_id), gateway_id, m.device_id, m.module_id, m.output, item.priority, item.enqueued_ms, sent_ms, item.ttl_s
    ) + list(m.properties) + [(name, system[key.lower()]) for name, key in FORWARDED_SYSTEM_PROPERTIES if key.lower() in system]


class BrokeredSender:
    """``BrokeredEndpoint("/modules/{m}/inputs/{i}")``: delivered on ``devices/{gateway}/modules/{m}/inputs/{i}``.

    ``BrokerHandle.publish`` only enqueues towards local subscribers, so a batch is "acknowledged" as soon
    as the broker has it.
    """

    def __init__(self, endpoint: Endpoint, broker: BrokerHandle, gateway_id: str, runtime: Runtime) -> None:
        self.id = endpoint.id
        self.runtime = runtime
        self.topic = f"devices/{gateway_id}/modules/{endpoint.module}/inputs/{endpoint.input}"
        self.broker = broker
        self.gateway_id = gateway_id
        self.estimate = LinkEstimate(initial_messages=100)

    async def wait_ready(self) -> None:
        return None

    def window(self) -> Window:
        return self.estimate.window()

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        sent_ms = wall_ms(self.runtime)
        for item in batch:
            self.broker.publish(
                self.topic,
                item.message.payload,
                qos=1,
                user_properties=identity_properties(item, self.gateway_id, sent_ms),
                content_type=item.message.content_type,
            )
        return len(batch)
