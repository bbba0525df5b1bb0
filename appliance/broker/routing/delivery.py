"""One message on its way to one session, and the two ports through which a durable session reaches the
store without doing I/O itself: ``DeliveryJournal`` (it records progress; ``persistence.BrokerStore``)
here, and ``session.Pager`` (it reads the session's backlog back; ``storage.StoredBacklog``).
"""

from __future__ import annotations

from typing import Protocol

from appliance.broker.routing.message import BrokerMessage


class Delivery:
    """One message on its way to one session: the QoS and retain flag it is delivered with, the
    subscription identifiers it carries, and, once sent, its packet id. ``released`` means PUBREC
    arrived and PUBREL was sent (QoS 2, waiting for PUBCOMP)."""

    __slots__ = ("message", "qos", "retain", "subscription_ids", "packet_id", "released", "sent", "seq", "spilled")

    def __init__(self, message: BrokerMessage, qos: int, retain: bool, subscription_ids: list[int] | None) -> None:
        self.message = message
        self.qos = qos
        self.retain = retain
        self.subscription_ids = subscription_ids
        self.packet_id = 0
        self.released = False
        self.sent = False
        #: The store's sequence number for a delivery to a durable session (0: not stored).
        self.seq = 0
        #: Handed to the store only: the session keeps no reference (its backlog, ``Session.spilled``).
        self.spilled = False


def stored_packet_id(seq: int) -> int:
    """The packet id a stored delivery is sent with when no delivery in flight has it already: its
    sequence number's, so the store records a session's sends in queue order as one sequence number
    (``DeliveryJournal.mark_sent_through``) instead of a packet id per delivery."""
    return seq % 65535 + 1


class DeliveryJournal(Protocol):
    """Where a durable session records its outbound progress (``persistence.BrokerStore`` fits): it only
    buffers, so calling it keeps this module free of I/O."""

    def mark_publish_sent(self, seq: int, packet_id: int) -> None: ...

    def mark_sent_through(self, client_id: str, seq: int) -> None:
        """The PUBLISH of ``seq`` went out with ``stored_packet_id(seq)``, and so did every stored
        delivery of this session before it that is still owed: a session sends its queue in order."""

    def mark_pubrel_sent(self, seq: int, packet_id: int) -> None: ...

    def remove_delivery(self, seq: int) -> None: ...

