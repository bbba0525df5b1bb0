"""Per-client protocol state, without I/O: what a session still owes (what a connection has agreed is
``connection``; its names are re-exported here, where most modules import them from).

Two objects, because MQTT separates them: ``ClientConnection`` lives as long as one network connection;
``Session`` outlives connections (clean start off, session expiry): outbound deliveries in flight (keyed
by packet id, in send order), the queue behind the Receive Maximum window, the backlog in the store, and
the inbound QoS 2 packet ids already acknowledged with PUBREC. Its methods are the QoS 1/2 flows: they
write PUBLISH and PUBREL bytes into the attached connection and return what finished so the broker can
update the store.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from appliance.broker.codec import packets as pk
from appliance.broker.codec.reasons import PACKET_IDENTIFIER_NOT_FOUND
from appliance.broker.codec.writer import encode_ack
from appliance.broker.routing.delivery import Delivery, DeliveryJournal
from appliance.broker.sessions.no_queue import NO_QUEUE
from appliance.broker.transport.connection import (
    ALLOWED_PACKETS,
    AUTHENTICATING,
    AWAITING_CONNECT,
    CLOSED,
    CONNECTED,
)
from appliance.broker.transport.connection import ClientConnection as _Connection

__all__ = [
    "ALLOWED_PACKETS", "AUTHENTICATING", "AWAITING_CONNECT", "CLOSED", "CONNECTED", "MEMORY_QUEUE_BYTES",
    "NEVER_EXPIRES", "NO_QUEUE", "ClientConnection", "Delivery", "DeliveryJournal", "Pager", "Session",
]

#: A network connection with its ``Session`` attached (``transport.connection`` knows no sessions).
ClientConnection = _Connection["Session"]

NEVER_EXPIRES = 0xFFFFFFFF
#: How much of a durable session's backlog is read from the store ahead of the window (``_read_ahead``).
READ_AHEAD_ROWS = 64
READ_AHEAD_BYTES = 1024 * 1024
#: Payload bytes a session queues in memory: past them the messages of an away or slow client that would
#: be queued in memory are dropped (next to ``max_queued_messages``: 1,000 queued messages of 4 MB would
#: be 4 GB of RAM), and the publishers of a connected client are held back (``router``).
MEMORY_QUEUE_BYTES = 8 * 1024 * 1024


class Pager(Protocol):
    """Reads a durable session's backlog back from the store, oldest first (``storage.StoredBacklog``):
    the deliveries after ``session.cursor``, at most ``limit``, and once ``max_bytes`` of payload are
    read no more (0: no byte budget); None when the store cannot be read now (the backlog stays as it
    is and is read on a later acknowledgement)."""

    def page(self, session: Session, limit: int, max_bytes: int = 0) -> list[Delivery] | None: ...


class Session:
    """What the broker owes one client id across connections (see the module docstring).

    ``queue`` is in memory: QoS 0 messages, and QoS 1/2 deliveries behind a connected client's window
    (bounded by holding its publishers back). The *backlog* is in the store only (a session with a
    ``pager``: durable, with a store): QoS 1/2 deliveries made while the client is away or a slow
    consumer, and every later one until it is empty again (order); ``spilled`` counts them, ``cursor``
    is the store sequence number up to which the session has taken everything into memory. They come
    back a window at a time (``fill_window``), so what is queued for an away session costs no memory.

    Bounds: ``queue_limit`` (``max_queued_messages``) counts what is queued in memory while the client
    is away or overloaded; ``byte_limit`` (``max_queued_bytes``, 0: none) the payload bytes of a durable
    session's stored deliveries (``stored_bytes``). ``deliver`` returns False for a QoS 1/2 delivery
    past a bound (the publisher hears 0x97). A connected client that makes progress loses nothing.
    """

    __slots__ = (
        "client_id", "username", "expiry_interval", "inflight", "queue", "_inbound_qos2", "connection", "will",
        "disconnected_at", "dropped", "queue_limit", "journal", "completed", "receive_check", "_next_packet_id",
        "_queued_qos0", "queued_bytes", "pager", "spilled", "cursor", "stored_bytes", "byte_limit",
    )

    def __init__(self, client_id: str, queue_limit: int, byte_limit: int = 0) -> None:
        self.client_id = client_id
        #: The user name of the latest connection: ACL checks for deliveries and wills made while the
        #: client is away use it.
        self.username: str | None = None
        self.expiry_interval = 0
        self.inflight: dict[int, Delivery] = {}
        #: NO_QUEUE until something is queued (then a deque of its own for good).
        self.queue: deque[Delivery] = NO_QUEUE
        self._inbound_qos2: set[int] | None = None
        self.connection: ClientConnection | None = None
        self.will: pk.Will | None = None
        self.disconnected_at: float | None = None
        self.dropped = 0
        self.queue_limit = queue_limit
        #: Set while the session is durable; records stored deliveries' progress.
        self.journal: DeliveryJournal | None = None
        #: QoS 1/2 deliveries the client has acknowledged: tells a slow reader from a stuck one.
        self.completed = 0
        #: The ACL read check for a delivery leaving the queue (None: everything may be read). A
        #: delivery is checked when it is sent, not only when it was queued: the ACL may have changed.
        self.receive_check: Callable[[Session, str], bool] | None = None
        self._next_packet_id = 1
        self._queued_qos0 = 0
        #: Payload bytes queued in memory (``queue``): the router holds publishers back past
        #: MEMORY_QUEUE_BYTES. A plain attribute, not a property: the router reads it per delivery.
        self.queued_bytes = 0
        #: Reads the backlog back from the store; set while the session is durable and there is a store.
        self.pager: Pager | None = None
        self.spilled = 0
        self.cursor = 0
        self.stored_bytes = 0
        self.byte_limit = byte_limit

    @property
    def inbound_qos2(self) -> set[int]:
        """Inbound QoS 2 packet ids acknowledged with PUBREC, awaiting their PUBREL. Made on first use: an
        empty set is 216 bytes, and most clients never publish at QoS 2."""
        ids = self._inbound_qos2
        if ids is None:
            ids = self._inbound_qos2 = set()
        return ids

    @inbound_qos2.setter
    def inbound_qos2(self, ids: set[int]) -> None:
        self._inbound_qos2 = ids

    @property
    def durable(self) -> bool:
        """Whether the session outlives its connection, so QoS 1/2 deliveries must go to the store."""
        return self.expiry_interval > 0

    def deliver(self, delivery: Delivery, now: float) -> bool:
        """Send now if connected and the window allows, else queue (in memory, or in the store's backlog:
        then ``delivery.spilled`` is set and the caller must store it). False if dropped (and counted):
        QoS 0 over the bound or for an overloaded client; QoS 1/2 only over a queue bound (see the class)."""
        connection = self.connection
        if delivery.qos == 0:
            if connection is not None and not self.queue:
                if connection.overloaded:
                    self.dropped += 1
                    return False
                self._write_publish(connection, delivery, now)
                return True
            if self._queued_qos0 >= self.queue_limit or self._memory_full(delivery):
                self.dropped += 1
                return False
            self._queued_qos0 += 1
            self._enqueue(delivery)
            return True
        queue = self.queue
        if self.pager is not None:
            size = len(delivery.message.payload)
            if connection is None or connection.overloaded or self.spilled:
                if self.byte_limit and self.stored_bytes + size > self.byte_limit:
                    self.dropped += 1
                    return False
                self.spilled += 1
                self.stored_bytes += size
                delivery.spilled = True
                return True
            self.stored_bytes += size
        elif connection is None or connection.overloaded:
            if len(queue) - self._queued_qos0 >= self.queue_limit or self._memory_full(delivery):
                self.dropped += 1
                return False
            if connection is None:
                self._enqueue(delivery)
                return True
        if not queue and len(self.inflight) < connection.send_quota:
            self._send_new(connection, delivery, now)
        else:  # ``_enqueue``, inline: every delivery behind a full window comes this way
            if queue is NO_QUEUE:
                queue = self.queue = deque()
            queue.append(delivery)
            self.queued_bytes += len(delivery.message.payload)
        return True

    def _memory_full(self, delivery: Delivery) -> bool:
        """Whether queuing ``delivery`` in memory would pass MEMORY_QUEUE_BYTES (one message always fits)."""
        return bool(self.queued_bytes) and self.queued_bytes + len(delivery.message.payload) > MEMORY_QUEUE_BYTES

    def _enqueue(self, delivery: Delivery) -> None:
        queue = self.queue
        if queue is NO_QUEUE:
            queue = self.queue = deque()
        queue.append(delivery)
        self.queued_bytes += len(delivery.message.payload)

    def on_puback(self, packet_id: int, now: float) -> Delivery | None:
        """A QoS 1 delivery is done; returns it (None for an unknown id, which is ignored)."""
        delivery = self.inflight.get(packet_id)
        if delivery is None or delivery.qos != 1:
            return None
        del self.inflight[packet_id]
        self._finished(delivery)
        self.fill_window(now)
        return delivery

    def on_pubrec(self, packet_id: int, reason_code: int, now: float) -> Delivery | None:
        """QoS 2 step two: reply PUBREL; returns the delivery whose state changed. A failure reason code
        (MQTT 5) ends the exchange instead (4.3.3)."""
        delivery = self.inflight.get(packet_id)
        connection = self.connection
        if delivery is None or delivery.qos != 2:
            if connection is not None:
                connection.out += encode_ack(pk.PUBREL, packet_id, connection.protocol_level, PACKET_IDENTIFIER_NOT_FOUND)
            return None
        if reason_code >= 0x80:
            del self.inflight[packet_id]
            self._finished(delivery)
            self.fill_window(now)
            return delivery
        delivery.released = True
        if delivery.seq and self.journal is not None:
            self.journal.mark_pubrel_sent(delivery.seq, packet_id)
        if connection is not None:
            connection.out += encode_ack(pk.PUBREL, packet_id, connection.protocol_level)
        return delivery

    def on_pubcomp(self, packet_id: int, now: float) -> Delivery | None:
        delivery = self.inflight.get(packet_id)
        if delivery is None or not delivery.released:
            return None
        del self.inflight[packet_id]
        self._finished(delivery)
        self.fill_window(now)
        return delivery

    def resume(self, connection: ClientConnection, now: float) -> list[Delivery]:
        """Attach a new connection and redeliver: unacknowledged PUBLISHes again with DUP, PUBRELs again,
        then the queue up to the window (MQTT 5 4.4). Returns deliveries that expired while waiting or
        that the ACL no longer lets this client read (both are dropped, not sent)."""
        self.connection = connection
        self.disconnected_at = None
        expired: list[Delivery] = []
        for packet_id, delivery in list(self.inflight.items()):
            if delivery.released:
                connection.out += encode_ack(pk.PUBREL, packet_id, connection.protocol_level)
            elif delivery.message.expired(now) or not self._readable(delivery):
                del self.inflight[packet_id]
                self._finished(delivery)
                expired.append(delivery)
            else:
                self._write_publish(connection, delivery, now, dup=delivery.sent)
        expired += self.fill_window(now)
        return expired

    def detach(self, now: float) -> None:
        """The client went away. A durable session's stored deliveries still waiting behind the window
        leave memory for the backlog (in flight ones stay: at most one window, resent on resume)."""
        self.connection = None
        self.disconnected_at = now
        if self.pager is None:
            return
        kept: deque[Delivery] = deque()
        first = 0
        for delivery in self.queue:
            if delivery.qos and delivery.seq:
                first = first or delivery.seq
                self.spilled += 1
            else:
                kept.append(delivery)
        if first:
            # Sent in queue order, so everything before ``first`` is in flight or done already.
            self.queue = kept
            self.queued_bytes = sum(len(delivery.message.payload) for delivery in kept)
            self.cursor = min(self.cursor, first - 1)

    def fill_window(self, now: float) -> list[Delivery]:
        """Move queued deliveries into flight while the client's Receive Maximum allows, reading the
        backlog ahead from the store when the memory queue runs out; each is checked against the ACL as
        it leaves (``receive_check``). Returns those dropped as expired or unreadable."""
        connection = self.connection
        expired: list[Delivery] = []
        if connection is None:
            return expired
        inflight = self.inflight
        quota = connection.send_quota
        may_read = self.receive_check
        while True:
            queue = self.queue  # again after a read ahead: the first one replaces NO_QUEUE
            while queue:
                delivery = queue[0]
                if delivery.qos and len(inflight) >= quota:
                    break
                queue.popleft()
                message = delivery.message
                self.queued_bytes -= len(message.payload)
                expires_at = message.expires_at  # ``message.expired``, inline: per delivery
                if (expires_at is not None and now >= expires_at) or (
                    may_read is not None and not may_read(self, message.topic)
                ):
                    expired.append(delivery)
                    self._finished(delivery)
                    if not delivery.qos:
                        self._queued_qos0 -= 1
                    continue
                if delivery.qos:
                    self._send_new(connection, delivery, now)
                else:
                    self._queued_qos0 -= 1
                    self._write_publish(connection, delivery, now)
            if queue or not self.spilled or len(inflight) >= quota or not self._read_ahead(min(quota, READ_AHEAD_ROWS)):
                return expired

    def _read_ahead(self, rows: int) -> bool:
        """Move the backlog's oldest deliveries to the memory queue: ``rows``, fewer past READ_AHEAD_BYTES
        (at least one). One read per window of small messages, at most a window more in memory than in
        flight, and each acknowledgement is answered at once by the next PUBLISH (sending per half window
        left clients without TCP_NODELAY waiting for delayed ACKs). False if nothing was read."""
        pager = self.pager
        page = pager.page(self, rows, READ_AHEAD_BYTES) if pager is not None else None
        if not page:
            if page is not None:
                self.spilled = 0
            return False
        self.spilled = max(0, self.spilled - len(page))
        for delivery in page:
            self.cursor = delivery.seq
            self._enqueue(delivery)
        return True

    def unspill(self) -> None:
        """The session stops being durable: its backlog moves into memory (the store forgets it)."""
        while self.spilled and self._read_ahead(1000):
            pass
        self.spilled = 0
        self.stored_bytes = 0
        self.pager = None

    def restore(self, delivery: Delivery) -> None:
        """Put back a delivery loaded from the store: in flight if it had a packet id, else queued (also
        one whose packet id another restored delivery has: never replace one in flight)."""
        if delivery.packet_id and delivery.packet_id not in self.inflight:
            self.inflight[delivery.packet_id] = delivery
            self._next_packet_id = delivery.packet_id % 65535 + 1
        else:
            self._enqueue(delivery)

    def clear(self) -> None:
        """Clean start: forget everything owed (subscriptions live in the topic tree)."""
        self.inflight.clear()
        self.queue.clear()
        self._inbound_qos2 = None
        self._queued_qos0 = 0
        self.queued_bytes = 0
        self.spilled = 0
        self.stored_bytes = 0

    def _send_new(self, connection: ClientConnection, delivery: Delivery, now: float) -> None:
        """Give a delivery its packet id and send it. A stored one takes its sequence number's
        (``stored_packet_id``, inline), so the store records one sequence number per session and turn
        instead of each delivery's packet id; only if a delivery in flight has that id does it take the
        next free one, recorded in its row. (The test comes first and once: it is all that a delivery
        that is not stored pays.)"""
        inflight = self.inflight
        if delivery.seq and self.journal is not None:
            seq = delivery.seq
            packet_id = seq % 65535 + 1
            if packet_id not in inflight:
                self.journal.mark_sent_through(self.client_id, seq)
            else:
                packet_id = self._free_packet_id()
                self.journal.mark_publish_sent(seq, packet_id)
        else:
            packet_id = self._next_packet_id
            while packet_id in inflight:
                packet_id = packet_id % 65535 + 1
            self._next_packet_id = packet_id % 65535 + 1
        delivery.packet_id = packet_id
        inflight[packet_id] = delivery
        self._write_publish(connection, delivery, now)

    def _free_packet_id(self) -> int:
        """The next packet id no delivery in flight has (``_send_new`` does the same inline)."""
        packet_id = self._next_packet_id
        while packet_id in self.inflight:
            packet_id = packet_id % 65535 + 1
        self._next_packet_id = packet_id % 65535 + 1
        return packet_id

    def _readable(self, delivery: Delivery) -> bool:
        check = self.receive_check
        return check is None or check(self, delivery.message.topic)

    def _finished(self, delivery: Delivery) -> None:
        self.completed += 1
        seq = delivery.seq
        if seq:
            if self.pager is not None:
                self.stored_bytes -= len(delivery.message.payload)
            if self.journal is not None:
                self.journal.remove_delivery(seq)
                delivery.seq = 0

    def _write_publish(self, connection: ClientConnection, delivery: Delivery, now: float, dup: bool = False) -> None:
        message = delivery.message
        if connection.v5 and connection.alias_maximum_out:
            alias, known = connection.alias_for(message.topic)
            frame = message.frame(True, delivery.qos, delivery.retain, dup, delivery.packet_id or None,
                                  delivery.subscription_ids, now, alias, known)
        else:
            frame = message.frame(connection.v5, delivery.qos, delivery.retain, dup, delivery.packet_id or None,
                                  delivery.subscription_ids, now)
        if len(frame) > connection.max_outbound_packet:
            # MQTT 5 3.1.2.25: never send a packet larger than the client accepts; treat it as delivered.
            if delivery.packet_id:
                self.inflight.pop(delivery.packet_id, None)
                self._finished(delivery)
            self.dropped += 1
            return
        delivery.sent = True
        connection.out += frame
