"""The reads of ``broker.db`` (``persistence.BrokerStore`` does the writes and the buffering): everything
a restart needs, and a session's queue a page at a time.

A restart loads sessions, subscriptions, inbound QoS 2 ids, retained messages and the deliveries in
flight, and only *counts* each session's queued deliveries: those are read back when the client
returns (``committed_page``, by the ``(client_id, seq)`` index), so neither the start nor an away
session's backlog needs memory for what is queued.
"""

from __future__ import annotations

import sqlite3

from appliance.broker.persistence.records import (
    BrokerState,
    LoadedSession,
    OutboundState,
    RetainedMessage,
    StoredDelivery,
    StoredMessage,
    StoredSession,
    StoredWill,
    properties_from_blob,
)
from appliance.broker.routing.topic_tree import SubscriptionOptions

#: An entry's message: its own columns, or the shared row in ``messages`` (``message_id`` set).
_BODY = (
    "coalesce(o.topic, m.topic), coalesce(o.payload, m.payload),"
    " CASE WHEN o.message_id IS NULL THEN o.properties ELSE m.properties END,"
    " CASE WHEN o.message_id IS NULL THEN o.expires_at ELSE m.expires_at END"
)
_PAGE = (
    f"SELECT o.seq, o.message_id, o.qos, o.retain, o.subscription_ids, {_BODY}"
    " FROM outbound o LEFT JOIN messages m ON m.id = o.message_id"
    " WHERE o.client_id = ? AND o.seq > ? AND o.state = 0 ORDER BY o.seq LIMIT ?"
)


def load_state(db: sqlite3.Connection) -> BrokerState:
    """Read everything committed a restart needs (queued deliveries counted, not read). Rows of clients
    without a session row are left out."""
    sessions: dict[str, LoadedSession] = {}
    for row in db.execute(
        "SELECT client_id, protocol_level, expiry_interval, username, disconnected_at, will_topic, will_payload,"
        " will_qos, will_retain, will_properties, will_delay_interval FROM sessions"
    ):
        will = None
        if row[5] is not None:
            will = StoredWill(row[5], row[6], row[7], bool(row[8]), properties_from_blob(row[9]), row[10])
        session = StoredSession(row[0], row[1], row[2], row[3], row[4], will)
        sessions[session.client_id] = LoadedSession(session)
    for row in db.execute(
        "SELECT client_id, topic_filter, qos, no_local, retain_as_published, retain_handling,"
        " subscription_identifier FROM subscriptions"
    ):
        loaded = sessions.get(row[0])
        if loaded is not None:
            loaded.subscriptions[row[1]] = SubscriptionOptions(row[2], bool(row[3]), bool(row[4]), row[5], row[6])
    # Queued deliveries are only counted: they are read back a window at a time (``page``).
    for row in db.execute(
        "SELECT o.client_id, sum(o.state = 0), sum(length(coalesce(o.payload, m.payload))) FROM outbound o"
        " LEFT JOIN messages m ON m.id = o.message_id GROUP BY o.client_id"
    ):
        loaded = sessions.get(row[0])
        if loaded is not None:
            loaded.queued, loaded.stored_bytes = row[1], row[2]
    messages: dict[int, StoredMessage] = {}
    for row in db.execute(
        "SELECT o.seq, o.client_id, o.message_id, o.qos, o.retain, o.subscription_ids, o.packet_id, o.state,"
        f" {_BODY} FROM outbound o LEFT JOIN messages m ON m.id = o.message_id"
        " WHERE o.state != 0 ORDER BY o.seq"
    ):
        loaded = sessions.get(row[1])
        if loaded is None or row[9] is None:  # a shared message that is gone: nothing to resend
            continue
        body = StoredMessage(row[8], row[9], properties_from_blob(row[10]), row[11])
        message_id = row[2]
        if message_id is not None:
            messages[message_id] = body
        loaded.outbound.append(StoredDelivery(row[0], row[1], message_id, row[3], bool(row[4]), subscription_ids(row[5]),
                                              row[6] or None, OutboundState(row[7]), None if message_id is not None else body))
    for row in db.execute("SELECT client_id, packet_id FROM inbound_qos2"):
        loaded = sessions.get(row[0])
        if loaded is not None:
            loaded.inbound_qos2.add(row[1])
    retained = {
        row[0]: RetainedMessage(row[0], row[1], row[2], properties_from_blob(row[3]), row[4])
        for row in db.execute("SELECT topic, payload, qos, properties, expires_at FROM retained")
    }
    return BrokerState(sessions, messages, retained)


def committed_page(db: sqlite3.Connection, client_id: str, after_seq: int, limit: int,
                   max_bytes: int = 0) -> tuple[list[tuple[StoredDelivery, StoredMessage]], bool]:
    """A session's committed, never sent deliveries after ``after_seq``, oldest first, at most ``limit``;
    rows are fetched one by one and none after ``max_bytes`` of payload (0: no byte budget). Returns the
    page and whether the byte budget ended it."""
    page: list[tuple[StoredDelivery, StoredMessage]] = []
    size = 0
    for row in db.execute(_PAGE, (client_id, after_seq, limit)):
        if row[6] is None:  # a shared message that is gone (a version 2 file could hold such a row)
            continue
        page.append((StoredDelivery(row[0], client_id, row[1], row[2], bool(row[3]), subscription_ids(row[4])),
                     StoredMessage(row[5], row[6], properties_from_blob(row[7]), row[8])))
        size += len(row[6])
        if max_bytes and size >= max_bytes:
            return page, True
    return page, False


def subscription_ids(column: object) -> tuple[int, ...]:
    """The subscription identifiers column ("1,5" or NULL)."""
    return tuple(int(part) for part in str(column).split(",")) if column else ()
