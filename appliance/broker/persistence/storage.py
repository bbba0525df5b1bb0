"""The mapping between the broker's live objects and ``broker.db``'s records, both ways.

``store`` knows rows and transactions, the broker knows sessions, deliveries and messages; this
module is the one place that translates (mosquitto keeps the same seam between ``database.c`` and
``persist_*.c``): what a session, a will, a queued delivery and a retained message are stored as, and
how a restart rebuilds the broker from what was stored. It only buffers changes in the store; the
broker's flush commits them before it sends any acknowledgement. The one read after the start is
``StoredBacklog``: a durable session's queue is left in the store and read back a window at a time.
"""

from __future__ import annotations

import logging
from typing import Any

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.context import HandlerContext
from appliance.broker.persistence.store import (
    BrokerStore,
    OutboundState,
    PersistenceError,
    RetainedMessage,
    StoredMessage,
    StoredSession,
    StoredWill,
)
from appliance.broker.routing.message import BrokerMessage
from appliance.broker.routing.topic_tree import TopicError
from appliance.broker.sessions.session import ClientConnection, Delivery, Session
from appliance.broker.sessions.will import will_delay

log = logging.getLogger("appliance.broker")

#: PUBLISH properties that travel with a message, by the names they are stored under.
STORED_PROPERTY_NAMES = {
    pr.PAYLOAD_FORMAT_INDICATOR: "payload_format_indicator",
    pr.CONTENT_TYPE: "content_type",
    pr.RESPONSE_TOPIC: "response_topic",
    pr.CORRELATION_DATA: "correlation_data",
    pr.USER_PROPERTY: "user_properties",
}
PROPERTY_IDS = {name: ident for ident, name in STORED_PROPERTY_NAMES.items()}


def stored_properties(properties: dict[int, Any]) -> dict[str, Any]:
    return {STORED_PROPERTY_NAMES[k]: v for k, v in properties.items() if k in STORED_PROPERTY_NAMES}


def properties_from(stored: dict[str, Any] | Any) -> dict[int, Any]:
    return {PROPERTY_IDS[name]: value for name, value in stored.items() if name in PROPERTY_IDS}


def stored_session(session: Session, connection: ClientConnection, disconnected_at: float | None,
                   will: pk.Will | None) -> StoredSession:
    stored_will = None
    if will is not None:
        stored_will = StoredWill(will.topic, will.payload, will.qos, will.retain, stored_properties(will.properties),
                                 will.properties.get(pr.WILL_DELAY_INTERVAL, 0))
    return StoredSession(session.client_id, connection.protocol_level, session.expiry_interval,
                         connection.username, disconnected_at, stored_will)


#: The largest payload stored in its queue entry (``store_deliveries``). The entry is updated when its
#: PUBLISH goes out, and SQLite rewrites a whole row to update it: a large body, in overflow pages, is
#: better kept in ``messages``, where it is written once.
INLINE_PAYLOAD_BYTES = 1024


def store_deliveries(context: HandlerContext, message: BrokerMessage, durable: list[tuple[Session, Delivery]], now: float) -> None:
    """Queue entries for the deliveries of ``message`` to durable sessions: the body in the entry when
    there is one and it is small, else stored once and referenced by each. A delivery the session keeps
    in memory moves its cursor: the store's copy is not read back. One that went to the stored backlog
    of a connected client with nothing in flight is read back at once: no acknowledgement will come to
    do it. A delivery already sent has its packet id (a spilled one was not sent: 0)."""
    store = context.store
    if store is None:
        return
    properties = stored_properties(message.properties) if message.properties else {}
    message_id = 0
    if len(durable) > 1 or len(message.payload) > INLINE_PAYLOAD_BYTES:
        message_id = store.add_message(StoredMessage(message.topic, message.payload, properties, message.expires_at))
    for session, delivery in durable:
        if message_id:
            delivery.seq = store.enqueue(session.client_id, message_id, delivery.qos, delivery.retain,
                                         delivery.subscription_ids or ())
            if delivery.packet_id:
                store.mark_publish_sent(delivery.seq, delivery.packet_id)
        else:
            delivery.seq = store.enqueue_message(
                session.client_id, delivery.qos, delivery.retain, delivery.subscription_ids, message.topic,
                message.payload, properties, message.expires_at, delivery.packet_id,
            )
        if not delivery.spilled:
            session.cursor = delivery.seq
        elif session.connection is not None and not session.inflight:
            # The session's own row is buffered by now, so the read back finds it (each session is in
            # ``durable`` once per message).
            session.fill_window(now)
            context.mark(session.connection)


def stores_retained(context: HandlerContext, message: BrokerMessage) -> bool:
    """Whether a change of this retained message goes to the store. ``$SYS`` values describe this run
    only; they are republished after a restart, not stored."""
    return context.store is not None and not message.topic.startswith("$SYS/")


class StoredBacklog:
    """``session.Pager`` over ``broker.db``: a durable session's backlog, read back a window at a time
    (``BrokerStore.page``), each row a fresh ``BrokerMessage`` holding the payload once (no received frame)."""

    def __init__(self, store: BrokerStore) -> None:
        self.store = store

    def page(self, session: Session, limit: int, max_bytes: int = 0) -> list[Delivery] | None:
        try:
            rows = self.store.page(session.client_id, session.cursor, limit, max_bytes)
        except PersistenceError as exc:
            log.warning("client %s: cannot read its queued messages now: %s", session.client_id, exc)
            return None
        in_flight = {delivery.seq for delivery in session.inflight.values()}
        deliveries: list[Delivery] = []
        for entry, stored in rows:
            if entry.seq in in_flight:
                continue
            message = BrokerMessage(stored.topic, stored.payload, 1, False, properties_from(stored.properties), None,
                              stored.expires_at)
            delivery = Delivery(message, entry.qos, entry.retain, list(entry.subscription_ids) or None)
            delivery.seq = entry.seq
            deliveries.append(delivery)
        return deliveries


def make_durable(context: HandlerContext, session: Session) -> None:
    """Give a session that outlives its connection its journal and its backlog in the store. A new
    backlog starts after every sequence number in use: what the store still holds for this client id
    belongs to an ended session whose deletion is not committed yet."""
    store = context.store
    assert store is not None
    session.journal = store
    if session.pager is None:
        session.pager = StoredBacklog(store)
        session.cursor = store.last_seq
        session.byte_limit = context.queue_bytes_limit


def store_retained(context: HandlerContext, message: BrokerMessage) -> None:
    """A retained message changed (an empty payload deletes it)."""
    store = context.store
    if store is None or not stores_retained(context, message):
        return
    if message.payload:
        store.set_retained(RetainedMessage(message.topic, message.payload, message.qos,
                                           stored_properties(message.properties), message.expires_at))
    else:
        store.delete_retained(message.topic)


def restore(context: HandlerContext, now: float) -> None:
    """Rebuild sessions, subscriptions, deliveries in flight, retained messages and pending wills from the
    store; queued deliveries stay there (each session's backlog, read when its client returns)."""
    store = context.store
    assert store is not None
    state = store.load()
    messages: dict[int, BrokerMessage] = {}
    for message_id, stored in state.messages.items():
        messages[message_id] = BrokerMessage(stored.topic, stored.payload, 1, False, properties_from(stored.properties),
                                       None, stored.expires_at)
    max_levels = context.limits.max_topic_levels
    for topic, retained in state.retained.items():
        if topic.count("/") >= max_levels:
            # Stored before max_topic_levels existed (or was lowered): a client could not publish it now.
            log.warning("skipping the stored retained message on %.200r: more than %d levels", topic, max_levels)
            continue
        context.retained.update(BrokerMessage(topic, retained.payload, retained.qos, True,
                                       properties_from(retained.properties), None, retained.expires_at))
    context.stats.retained_count = len(context.retained)
    for client_id, loaded in state.sessions.items():
        stored_row = loaded.session
        disconnected_at = stored_row.disconnected_at
        if disconnected_at is None:
            # The gateway died while this client was connected: an abnormal end, as of now.
            disconnected_at = now
            store.set_disconnected(client_id, now)
        if stored_row.will is not None:
            # Either that abnormal end, or a client that was already away and whose will was still
            # waiting out its delay: due at its original time (past times: at ``start``).
            will = stored_row.will
            props = properties_from(will.properties)
            if will.delay_interval:
                props[pr.WILL_DELAY_INTERVAL] = will.delay_interval
            pending_will = pk.Will(will.topic, will.payload, will.qos, will.retain, props)
            context.wills.schedule(client_id, pending_will,
                                  disconnected_at + will_delay(pending_will, stored_row.expiry_interval))
        # Sessions that expired while the gateway was down are restored too: ``start`` publishes their
        # wills (the ACL needs the session's user name) and then ends them.
        session = Session(client_id, context.limits.max_queued_messages, context.queue_bytes_limit)
        session.receive_check = context.receive_check()
        session.expiry_interval = stored_row.expiry_interval
        session.username = stored_row.username
        session.disconnected_at = disconnected_at
        session.journal = store
        # The queued (never sent) deliveries stay in the store, read back when the client returns.
        session.pager = StoredBacklog(store)
        session.spilled = loaded.queued
        session.stored_bytes = loaded.stored_bytes
        session.inbound_qos2 = set(loaded.inbound_qos2)
        for topic_filter, options in loaded.subscriptions.items():
            try:
                context.tree.subscribe(client_id, topic_filter, options)
            except TopicError as exc:
                # Invalid now, e.g. deeper than max_topic_levels (stored before the limit existed).
                log.warning("client %s: dropping stored subscription %.200r: %s", client_id, topic_filter, exc)
        for entry in loaded.outbound:
            body = entry.body
            if body is not None:  # queued for this session only: the message was in the entry
                message = BrokerMessage(body.topic, body.payload, 1, False, properties_from(body.properties), None,
                                        body.expires_at)
            else:
                shared = messages.get(entry.message_id) if entry.message_id is not None else None
                if shared is None:
                    continue
                message = shared
            delivery = Delivery(message, entry.qos, entry.retain, list(entry.subscription_ids) or None)
            delivery.seq = entry.seq
            if entry.state != OutboundState.QUEUED and entry.packet_id:
                delivery.packet_id = entry.packet_id
                delivery.sent = True
                delivery.released = entry.state == OutboundState.PUBREL_SENT
            session.restore(delivery)
        context.sessions[client_id] = session
    if state.sessions or state.retained:
        log.info("restored %d durable sessions and %d retained messages from %s", len(state.sessions),
                 len(state.retained), store.path)
