"""What the broker answers when ``broker.db`` cannot commit (a full disk, an I/O error, a read-only file).

The rule is "commit before ack": an acknowledgement whose change is not on disk must not leave. Only what
depends on the failed commit is held back, and it is answered instead of waiting; everything else (CONNACK
of a clean session, PINGRESP, the state store's error response) leaves as usual, so the gateway does not
freeze while the disk is full.

Rules
-----
* **Acknowledgements written in the failing turn** (``HeldAck``): an MQTT 5 PUBACK/PUBREC is rewritten in
  place to the failure code (the rest of the buffer, other acknowledgements included, leaves as it was);
  anything else - a CONNACK, SUBACK, UNSUBACK, PUBCOMP, or any acknowledgement to a 3.1.1 client, which
  has no way to say no - is cut off with everything after it and the connection is closed (a CONNACK
  becomes the failure CONNACK, other MQTT 5 packets get DISCONNECT with the code first).
* The client sends its unacknowledged packets again after reconnecting. What those packets changed is
  *kept* and committed with the next successful commit (``BrokerStore`` retries the failed batch), so their
  messages may still reach subscribers: at least once, never lost.
* **While the store keeps failing** every request that would need a write is refused before it changes
  anything (``refuse_publish`` and the other helpers below, called from the handlers), so memory does not
  grow with changes that cannot be written: a QoS 1/2 PUBLISH that would be stored (a durable subscriber,
  a retained message, a QoS 2 exchange of a durable session), a CONNECT of a durable session, and
  SUBSCRIBE/UNSUBSCRIBE of a durable session. Everything else is served as usual: PINGREQ, QoS 0, QoS 1/2
  between non-durable sessions, clean sessions and their subscriptions, the services.
* The failure code is 0x97 Quota exceeded when SQLite reports the disk full, 0x80 Unspecified error for
  any other failure (MQTT 3.1.1 CONNACK: return code 3, server unavailable).

Theory of operation
-------------------
The broker notes where in the connection's buffer each acknowledgement starts whose handling buffered a
change, by the store's ``revision``: only an offset per acknowledgement, read back into a ``HeldAck`` if
the commit fails. No asyncio, no time module.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.properties import decode_varint
from appliance.broker.codec.writer import encode, encode_ack
from appliance.broker.context import HandlerContext
from appliance.broker.persistence.store import PersistenceError
from appliance.broker.sessions import lifecycle
from appliance.broker.sessions.session import CLOSED, ClientConnection, Session
from appliance.broker.transport.link import Link
from appliance.runtime import Timer
from appliance.store_health import StoreHealth

WHY = "the broker cannot store this now (its database does not commit: disk full?)"
#: Seconds between attempts to commit while the store fails; a turn in between does not try, so a full
#: disk costs one failing write per interval, not one per loop turn, and recovery takes at most this long.
COMMIT_RETRY = 0.5


@dataclass(slots=True)
class HeldAck:
    """``connection.out[start:end]`` acknowledges a change that is not committed yet."""

    start: int
    end: int
    packet_type: int
    packet_id: int

    @classmethod
    def at(cls, out: bytearray, start: int) -> HeldAck:
        """The acknowledgement the broker encoded at ``out[start]`` (a CONNACK has no packet id)."""
        packet_type = out[start] >> 4
        length, body = decode_varint(out, start + 1, len(out))
        packet_id = 0 if packet_type == pk.CONNACK else (out[body] << 8) | out[body + 1]
        return cls(start, body + length, packet_type, packet_id)


class CommitGate:
    """The broker's commits: whether they succeed (``health``), the retry while they fail, and the
    acknowledgements of this turn that wait on the commit (``hold``, then ``settle`` when written)."""

    def __init__(self, context: HandlerContext, log: logging.Logger) -> None:
        self.context = context
        store = context.store
        self.health = StoreHealth(
            str(store.path) if store is not None else "broker store", log,
            f"requests that need a write are refused until a commit succeeds (retried every {COMMIT_RETRY} s)",
        )
        self._closing: dict[ClientConnection, bool] = {}
        self._retry: Timer | None = None
        self._next_attempt = 0.0

    def revision(self) -> int:
        """Take before handling a packet; ``hold`` compares (``BrokerStore.revision``)."""
        store = self.context.store
        return store.revision if store is not None else 0

    def hold(self, connection: ClientConnection, revision: int, start: int) -> None:
        """If the store buffered a change since ``revision``, the acknowledgement encoded at
        ``connection.out[start]`` depends on this turn's commit. (Per message, ``accept_publish`` does
        the same inline.)"""
        store = self.context.store
        if store is not None and store.revision != revision:
            connection.held_acks.append(start)

    def forget(self, connection: ClientConnection) -> None:
        connection.held_acks.clear()

    def settle(self, connection: ClientConnection, committed: bool) -> None:
        """Before ``connection.out`` is written: if the commit failed, answer what waited on it."""
        starts = connection.held_acks
        if not starts:
            return
        held = [HeldAck.at(connection.out, start) for start in starts] if not committed else []
        starts.clear()
        if held and answer_failed_commit(self.context, connection, held):
            self._closing[connection] = held[-1].packet_type == pk.CONNACK

    def close_if_refused(self, connection: ClientConnection) -> None:
        """After ``out`` was written: end the connection ``settle`` found must end."""
        connack_refused = self._closing.pop(connection, None)
        if connack_refused is not None:
            close_after_failed_commit(self.context, connection.link, connack_refused)

    def commit(self) -> bool:
        """Commit what is buffered; False if it failed (or, while the store fails, if the next attempt
        is not due yet: the retry timer makes it)."""
        context = self.context
        store = context.store
        assert store is not None
        if not store.has_pending:
            return True
        health = self.health
        healthy = health.healthy
        if not healthy:
            now = context.runtime.monotonic()
            if now < self._next_attempt:
                self._schedule_retry(self._next_attempt - now)
                return False
        try:
            store.commit()
        except PersistenceError as exc:
            now = context.runtime.monotonic()
            self._next_attempt = now + COMMIT_RETRY
            if health.failed(str(exc.__cause__ or exc), exc.disk_full, now):
                self._state_changed()
            self._schedule_retry(COMMIT_RETRY)
            return False
        # Once per loop turn: while the store is healthy (the common case) no clock is read here.
        if not healthy and health.succeeded(context.runtime.monotonic()):
            self._state_changed()
        return True

    def stop(self) -> None:
        """The broker stopped: no more retries (the store is about to be closed)."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def _schedule_retry(self, delay: float) -> None:
        if self._retry is None:
            self._retry = self.context.runtime.call_later(delay, self._retry_commit)

    def _retry_commit(self) -> None:
        """While the store fails, try again even if no client does anything: the gateway recovers by
        itself once the disk has room."""
        self._retry = None
        self.context.flush()

    def _state_changed(self) -> None:
        self.context.store_failing = not self.health.healthy
        self.context.stats.store_health(self.health)
        self.context.last_sys = 0.0  # ``$SYS`` at the next tick, not at the next interval


def failure_code(context: HandlerContext) -> int:
    return rc.QUOTA_EXCEEDED if context.store_health.disk_full else rc.UNSPECIFIED_ERROR


def _reason(connection: ClientConnection) -> dict[int, Any] | None:
    return {pr.REASON_STRING: WHY} if connection.request_problem_info else None


# -- the turn whose commit failed -----------------------------------------------------------------------


def answer_failed_commit(context: HandlerContext, connection: ClientConnection, held: list[HeldAck]) -> bool:
    """Rewrite ``connection.out`` so that no acknowledgement in ``held`` claims success; returns whether
    the connection must close once what is left of ``out`` is written."""
    code = failure_code(context)
    out = connection.out
    kept = bytearray()
    position = 0
    must_close = False
    for ack in held:
        kept += out[position:ack.start]
        position = ack.end
        if connection.v5 and ack.packet_type in (pk.PUBACK, pk.PUBREC):
            kept += encode_ack(ack.packet_type, ack.packet_id, pk.MQTT_5, code, _reason(connection))
            if ack.packet_type == pk.PUBREC:
                _forget_inbound_qos2(context, connection.session, ack.packet_id)
            continue
        if ack.packet_type == pk.CONNACK:
            refusal = pk.Connack(False, failure_code(context), _reason(connection) or {})
            kept += encode(refusal, connection.protocol_level)
        must_close = True
        position = len(out)
        break
    kept += out[position:]
    out[:] = kept
    context.store_health.refused += len(held)
    return must_close


def _forget_inbound_qos2(context: HandlerContext, session: Session | None, packet_id: int) -> None:
    """A refused QoS 2 PUBLISH gets no PUBREL: its packet id must not block a later message."""
    if session is None or packet_id not in session.inbound_qos2:
        return
    session.inbound_qos2.discard(packet_id)
    if session.journal is not None and context.store is not None:
        context.store.remove_inbound_qos2(session.client_id, packet_id)


def close_after_failed_commit(context: HandlerContext, link: Link, connack_refused: bool) -> None:
    """End a connection whose acknowledgement could not be given. After a failure CONNACK nothing more
    is sent (no DISCONNECT), and no will: the CONNECT was not accepted."""
    connection = link.connection
    if connection.state == CLOSED:
        return
    now = context.runtime.now()  # after a flush's commit: not a batch of packets, a reading of its own
    if not connack_refused:
        lifecycle.close(context, link, failure_code(context), WHY, now)
        return
    connection.state = CLOSED
    connection.clean_disconnect = True
    lifecycle.disconnected(context, connection, now)
    context.close_after_flush(link)


# -- while the store keeps failing ----------------------------------------------------------------------


def publish_needs_write(context: HandlerContext, session: Session, publish: pk.Publish) -> bool:
    """Whether accepting this QoS 1/2 PUBLISH would buffer a change for the store (an upper bound: the
    ACL and no-local are not looked at)."""
    if publish.retain and not publish.topic.startswith("$SYS/"):
        return True
    if publish.qos == 2 and session.journal is not None:
        return True
    return context.router.reaches_durable(publish.topic)


def refuse_publish(context: HandlerContext, link: Link, publish: pk.Publish, now: float) -> None:
    """MQTT 5: PUBACK/PUBREC with the failure code; 3.1.1: close without acknowledging."""
    context.store_health.refused += 1
    connection = link.connection
    if connection.v5:
        assert publish.packet_id is not None  # QoS 1/2
        packet_type = pk.PUBACK if publish.qos == 1 else pk.PUBREC
        connection.out += encode_ack(packet_type, publish.packet_id, pk.MQTT_5, failure_code(context),
                                     _reason(connection))
    else:
        lifecycle.close(context, link, failure_code(context), WHY, now)


def connect_needs_write(context: HandlerContext, client_id: str, expiry: int) -> bool:
    """A durable session is saved at CONNECT; replacing a stored one deletes it."""
    session = context.sessions.get(client_id) if client_id else None
    return expiry > 0 or (session is not None and session.journal is not None)


def unsubscribe_refused(context: HandlerContext, link: Link, count: int, now: float) -> list[int] | None:
    """A durable session's UNSUBSCRIBE: MQTT 5 gets 0x80 per filter (UNSUBACK has no Quota exceeded);
    3.1.1 has no failure code, so the connection closes (returns None)."""
    context.store_health.refused += 1
    if link.connection.v5:
        return [rc.UNSPECIFIED_ERROR] * count
    lifecycle.close(context, link, failure_code(context), WHY, now)
    return None


def pubrel_refused(context: HandlerContext, link: Link, now: float) -> None:
    """PUBCOMP of a durable session's QoS 2 exchange would need a write, and has no failure code: close;
    the client sends PUBREL again after reconnecting."""
    context.store_health.refused += 1
    lifecycle.close(context, link, failure_code(context), WHY, now)

