"""The statements ``BrokerStore`` writes a turn's batch with, one per kind of change.

They sit apart from the store's buffering logic so that ``store`` reads as what it does (buffer,
cancel out, commit) and the SQL can be checked against ``schema``'s layout in one place.
"""

INSERT_MESSAGE = "INSERT INTO messages (id, topic, payload, properties, expires_at) VALUES (?, ?, ?, ?, ?)"
#: A delivery whose body is in its row, with nothing else to store: most deliveries to a durable session.
#: Columns left out are NULL, and binding fewer values is measurably cheaper (``sqlite3`` binds a NULL
#: through its adapter lookup, about 0.3 us each on CPython 3.11).
INSERT_DELIVERY = (
    "INSERT INTO outbound (seq, client_id, qos, retain, packet_id, state, topic, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
#: The same with every column: a shared body (``message_id``), subscription identifiers, properties, expiry.
INSERT_DELIVERY_FULL = (
    "INSERT INTO outbound (seq, client_id, qos, retain, packet_id, state, topic, payload, message_id,"
    " subscription_ids, properties, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
MARK_DELIVERY = "UPDATE outbound SET packet_id = ?, state = ? WHERE seq = ?"
#: A session's PUBLISHes sent in queue order, up to ``seq``, with the packet ids their sequence numbers give:
#: one row per session and turn instead of an UPDATE per delivery (1.3 us per message; bench/RESULTS.md).
#: Never lowered (a buffered batch retried after a later one cannot move it back).
MARK_SENT_THROUGH = (
    "INSERT INTO outbound_sent (client_id, seq) VALUES (?, ?)"
    " ON CONFLICT (client_id) DO UPDATE SET seq = max(seq, excluded.seq)"
)
#: On opening: what ``outbound_sent`` says, written into the rows themselves (state PUBLISH_SENT, the packet
#: id of ``routing.delivery.stored_packet_id``, spelled out in SQL), so that loading and paging read one kind
#: of row.
SETTLE_SENT_THROUGH = (
    "UPDATE outbound SET packet_id = outbound.seq % 65535 + 1, state = 1 FROM outbound_sent s"
    " WHERE outbound.client_id = s.client_id AND outbound.seq <= s.seq AND outbound.state = 0"
    " AND outbound.packet_id = 0"
)
FORGET_SENT_THROUGH = "DELETE FROM outbound_sent"
#: The deliveries whose sequence numbers are in a JSON array: one statement for a turn's acknowledgements,
#: 0.4-0.5 us per row cheaper than ``executemany`` of a DELETE per row (bench/RESULTS.md).
DELETE_DELIVERIES = "DELETE FROM outbound WHERE seq IN (SELECT value FROM json_each(?))"
UPSERT_SESSION = (
    "INSERT OR REPLACE INTO sessions (client_id, protocol_level, expiry_interval, username, disconnected_at,"
    " will_topic, will_payload, will_qos, will_retain, will_properties, will_delay_interval)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SET_DISCONNECTED = "UPDATE sessions SET disconnected_at = ? WHERE client_id = ?"
CLEAR_WILL = (
    "UPDATE sessions SET will_topic = NULL, will_payload = NULL, will_qos = NULL, will_retain = NULL,"
    " will_properties = NULL, will_delay_interval = NULL WHERE client_id = ?"
)
UPSERT_SUBSCRIPTION = (
    "INSERT OR REPLACE INTO subscriptions (client_id, topic_filter, qos, no_local, retain_as_published,"
    " retain_handling, subscription_identifier) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
DELETE_SUBSCRIPTION = "DELETE FROM subscriptions WHERE client_id = ? AND topic_filter = ?"
ADD_INBOUND = "INSERT OR IGNORE INTO inbound_qos2 (client_id, packet_id) VALUES (?, ?)"
REMOVE_INBOUND = "DELETE FROM inbound_qos2 WHERE client_id = ? AND packet_id = ?"
UPSERT_RETAINED = "INSERT OR REPLACE INTO retained (topic, payload, qos, properties, expires_at) VALUES (?, ?, ?, ?, ?)"
DELETE_RETAINED = "DELETE FROM retained WHERE topic = ?"
DELETE_SESSION = (
    "DELETE FROM sessions WHERE client_id = ?",
    "DELETE FROM subscriptions WHERE client_id = ?",
    "DELETE FROM inbound_qos2 WHERE client_id = ?",
    "DELETE FROM outbound_sent WHERE client_id = ?",
)
# Only entries enqueued before delete_session: later ones in the same turn belong to the new session.
DELETE_SESSION_QUEUE = "DELETE FROM outbound WHERE client_id = ? AND seq < ?"
