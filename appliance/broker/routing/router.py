"""Publish -> deliveries: which sessions get a message, with which QoS, retain flag and identifiers.

The subscription tree only finds matching subscriptions; the rules that need the publisher and the
sessions live here (MQTT 5 3.3.4 and 4.8):

* overlapping subscriptions of one client give ONE delivery, with the highest granted QoS, the retain
  flag kept if any of them asked for retain-as-published, and every subscription identifier;
* no-local subscriptions skip the publisher's own messages;
* a shared subscription delivers to one member, round-robin, preferring connected members;
* the ACL read check runs per delivery (mosquitto does the same), so ``#`` only carries readable topics.

Sans-I/O: ``route`` writes into sessions (which write into their connections' ``out`` buffers) and tells
the caller which connections now have bytes to flush and which durable deliveries must be stored.
"""

from __future__ import annotations

from appliance.broker.routing.message import BrokerMessage
from appliance.broker.routing.topic_tree import Subscription, SubscriptionTree
from appliance.broker.security.acl import Acl
from appliance.broker.sessions.session import MEMORY_QUEUE_BYTES, ClientConnection, Delivery, Session

#: Deliveries queued behind a connected client's Receive Maximum window past which the publishers
#: feeding it are held back (and released again at QUEUE_LOW_WATER): memory stays bounded by TCP
#: backpressure instead of growing with a slow reader's queue.
QUEUE_HIGH_WATER = 1000
QUEUE_LOW_WATER = 250
#: Bytes of shared-subscription round-robin positions (their keys' text plus ~150 bytes each) kept before
#: they all start over at the first member: a position outlives its subscription, so without a bound
#: distinct (up to 64 KB) groups and filters grew the map without end (``cache_bounds``).
SHARE_CURSOR_BYTES = 1024 * 1024


class Router:
    def __init__(self, tree: SubscriptionTree, sessions: dict[str, Session], acl: Acl | None) -> None:
        self.tree = tree
        self.sessions = sessions
        #: None means no ACL file: everyone may read everything (no per-delivery check at all).
        self.acl = acl
        self._share_cursor: dict[tuple[str, str], int] = {}
        #: Estimated bytes of ``_share_cursor`` (``SHARE_CURSOR_BYTES``).
        self.share_cursor_bytes = 0
        #: QoS 1/2 deliveries dropped because the receiver's queue was at its bound (``Session.deliver``);
        #: the caller compares it around ``route`` to answer the publisher 0x97 Quota exceeded.
        self.queue_full = 0
        #: Deliveries handed to sessions, by the QoS they are delivered with (0, 1, 2): the Prometheus page's
        #: messages out per QoS (``retained_feed`` adds its deliveries here too).
        self.sent_by_qos = [0, 0, 0]
        #: Client id -> the topics of live deliveries to it while retained messages are still being fed to
        #: it (``retained_feed``): their retained messages are older and are skipped.
        self.live_topics: dict[str, set[str]] = {}

    def route(
        self,
        message: BrokerMessage,
        now: float,
        touched: list[ClientConnection],
        durable: list[tuple[Session, Delivery]],
        congested: list[ClientConnection],
    ) -> int:
        """Deliver ``message`` to every matching session; returns the number of deliveries.

        ``touched`` gets each connection that was written to and is not yet waiting for a flush (its
        ``flush_pending`` is set); ``durable`` each QoS 1/2 delivery to a session that outlives its
        connection, which the caller must persist; ``congested`` each connection delivered to while its
        socket is congested or its queue is over QUEUE_HIGH_WATER, so the caller can hold the publisher
        back.
        """
        match = self.tree.match(message.topic)
        sessions = self.sessions
        count = 0
        if match.subscribers:
            for client_id, subscriptions in match.subscribers.items():
                session = sessions.get(client_id)
                if session is None:
                    continue
                delivery = self._delivery(message, client_id, session, subscriptions)
                if delivery is None:
                    continue
                count += self._hand_over(session, delivery, now, touched, durable, congested)
        if match.shared:
            for key, members in match.shared.items():
                session, subscription = self._pick_member(key, members)
                if session is None:
                    continue
                delivery = self._delivery(message, subscription.client_id, session, (subscription,))
                if delivery is not None:
                    count += self._hand_over(session, delivery, now, touched, durable, congested)
        return count

    def reaches_durable(self, topic: str) -> bool:
        """Whether a QoS 1/2 message on ``topic`` would be stored for a durable session: some session
        that outlives its connection subscribes with QoS 1 or 2. An upper bound (the ACL and no-local
        are not looked at); the broker asks only while its store fails (``store_failure``)."""
        match = self.tree.match(topic)
        sessions = self.sessions
        groups = [*match.subscribers.values(), *match.shared.values()]
        for subscriptions in groups:
            for subscription in subscriptions:
                session = sessions.get(subscription.client_id)
                if session is not None and session.expiry_interval and subscription.options.qos:
                    return True
        return False

    def _hand_over(
        self,
        session: Session,
        delivery: Delivery,
        now: float,
        touched: list[ClientConnection],
        durable: list[tuple[Session, Delivery]],
        congested: list[ClientConnection],
    ) -> int:
        if not session.deliver(delivery, now):
            if delivery.qos:
                self.queue_full += 1
            return 0
        self.sent_by_qos[delivery.qos] += 1
        if self.live_topics:
            topics = self.live_topics.get(session.client_id)
            if topics is not None:
                topics.add(delivery.message.topic)
        if delivery.qos and session.expiry_interval:
            durable.append((session, delivery))
        connection = session.connection
        if connection is not None:
            if connection.out and not connection.flush_pending:
                connection.flush_pending = True
                touched.append(connection)
            # An empty queue holds no bytes (``queued_bytes`` is its payloads' sum): one test per delivery
            # for the common case, the two bounds only behind it.
            queue = session.queue
            if connection.congested or queue and (
                len(queue) >= QUEUE_HIGH_WATER or session.queued_bytes >= MEMORY_QUEUE_BYTES
            ):
                congested.append(connection)
        return 1

    def _delivery(
        self, message: BrokerMessage, client_id: str, session: Session, subscriptions: tuple[Subscription, ...]
    ) -> Delivery | None:
        acl = self.acl
        if acl is not None and not acl.can_receive(client_id, session.username, message.topic):
            return None
        if len(subscriptions) == 1:
            options = subscriptions[0].options
            if options.no_local and client_id == message.origin:
                return None
            sub_id = options.subscription_identifier
            qos = options.qos if options.qos < message.qos else message.qos
            retain = message.retain and options.retain_as_published
            return Delivery(message, qos, retain, [sub_id] if sub_id is not None else None)
        qos = -1
        retain = False
        sub_ids: list[int] = []
        for subscription in subscriptions:
            options = subscription.options
            if options.no_local and client_id == message.origin:
                continue
            if options.qos > qos:
                qos = options.qos
            if options.retain_as_published:
                retain = message.retain
            if options.subscription_identifier is not None:
                sub_ids.append(options.subscription_identifier)
        if qos < 0:
            return None
        return Delivery(message, min(qos, message.qos), retain, sub_ids or None)

    def _pick_member(
        self, key: tuple[str, str], members: tuple[Subscription, ...]
    ) -> tuple[Session | None, Subscription]:
        """Round-robin over the group, skipping members that are offline when an online one exists."""
        start = self._share_cursor.get(key)
        if start is None:
            start = 0
            size = len(key[0]) + len(key[1]) + 150
            if self.share_cursor_bytes + size > SHARE_CURSOR_BYTES:
                self._share_cursor.clear()
                self.share_cursor_bytes = 0
            self.share_cursor_bytes += size
        count = len(members)
        fallback: tuple[Session | None, Subscription] = (None, members[0])
        for step in range(count):
            index = (start + step) % count
            subscription = members[index]
            session = self.sessions.get(subscription.client_id)
            if session is None:
                continue
            if session.connection is not None:
                self._share_cursor[key] = index + 1
                return session, subscription
            if fallback[0] is None:
                fallback = (session, subscription)
        self._share_cursor[key] = start + 1
        return fallback
