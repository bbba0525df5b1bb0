"""The broker: sessions, router, retained messages, wills, the store and the in-process services, tied
together per packet; and ``BrokerHandle`` for those services.

Why it is built this way:

* Throughput in Python is per-message work, so the unit of work is a *batch*: the socket layer hands over
  every packet of one read, they are all handled, and each connection that got bytes is queued for ONE
  flush. The flush (``loop.call_soon``, once per loop turn) first commits the store, then writes every
  connection's buffer: a QoS 1/2 PUBACK/PUBREC can only leave after the message it acknowledges is on
  disk ("we commit before we ack").
* Everything synchronous stays synchronous. Two steps must wait: checking a password (PBKDF2 runs in an
  executor) and a service's ``on_publish``. Then the rest of that connection's batch waits in a backlog
  and its socket stops reading until the step is done, so one client's packets keep their order and
  other clients never wait.
* Errors from bad input are ``ProtocolError``s with a reason code; ``_fail`` is the one place that turns
  one into a DISCONNECT (MQTT 5) or a plain close (3.1.1) and a log line with the client id.
* Clocks: keep-alive uses the loop's monotonic clock; expiry times are wall-clock (``time.time()``)
  because they are persisted and must survive a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from appliance.broker.acl import Acl
from appliance.broker.api import ACCEPTED, BrokerService, InboundPublish, PublishVerdict
from appliance.broker.auth import Authenticator
from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reasons import ProtocolError
from appliance.broker.codec.writer import PINGRESP_BYTES, encode, encode_ack
from appliance.broker.config import BrokerConfig
from appliance.broker.message import Message
from appliance.broker.persistence import (
    BrokerStore,
    OutboundState,
    PersistenceError,
    RetainedMessage,
    StoredMessage,
    StoredSession,
    StoredWill,
)
from appliance.broker.retain import RetainedMessages
from appliance.broker.router import QUEUE_LOW_WATER, Router
from appliance.broker.session import (
    ALLOWED_PACKETS,
    AUTHENTICATING,
    AWAITING_CONNECT,
    CLOSED,
    CONNECTED,
    NEVER_EXPIRES,
    Connection,
    Delivery,
    Session,
)
from appliance.broker.sys_topics import BrokerStats
from appliance.broker.topic_tree import SubscriptionOptions, SubscriptionTree, TopicError, topic_matches
from appliance.broker.will import PendingWills, will_delay

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

#: Packets of one connection handled per loop turn; the rest of a big read waits for the next turns.
TURN_PACKET_BUDGET = 128
#: Deliveries buffered since the last flush after which a read writes at once instead of waiting.
EARLY_FLUSH_DELIVERIES = 2000
#: Seconds a congested client may hold its publishers back before it counts as a slow consumer.
SLOW_CONSUMER_GRACE = 2.0
#: Session takeovers of one client id inside this window count as flapping.
FLAP_WINDOW = 10.0
FLAP_FREE_TAKEOVERS = 3
FLAP_MAX_DELAY = 5.0


class Link(Protocol):
    """What the broker needs from the socket layer for one connection (``server.ClientProtocol``)."""

    connection: Connection

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def hold_reading(self, reason: str, held: bool) -> None: ...

    def start_keepalive(self, seconds: float) -> None: ...


class Broker:
    """One broker instance; implements ``api.BrokerHandle``."""

    def __init__(
        self,
        config: BrokerConfig,
        store: BrokerStore | None,
        authenticator: Authenticator,
        acl: Acl | None,
        services: Sequence[BrokerService] = (),
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.store = store
        self.authenticator = authenticator
        self.acl = acl
        self.services = list(services)
        self.tree = SubscriptionTree()
        self.sessions: dict[str, Session] = {}
        self.router = Router(self.tree, self.sessions, acl)
        self.retained = RetainedMessages()
        self.wills = PendingWills()
        self.stats = BrokerStats(started_at=time.time())
        self.links: set[Link] = set()
        self._service_filters = [(f, s) for s in self.services for f in s.topic_filters]
        self._service_cache: dict[str, tuple[BrokerService, ...]] = {}
        self._dirty: list[Connection] = []
        self._flush_scheduled = False
        self._since_flush = 0
        self._congested_hits: list[Connection] = []
        self._backlogs: dict[Connection, deque[pk.Packet]] = {}
        #: Backpressure: congested connections -> the publisher links held back for them, and how many
        #: congested connections hold each publisher back.
        self._held_back: dict[Connection, set[Link]] = {}
        self._holding: dict[Link, int] = {}
        self._takeovers: dict[str, deque[float]] = {}
        self._tick_handle: asyncio.TimerHandle | None = None
        self._last_sys = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the store, start services, start the periodic tick. Call before listeners accept."""
        self._loop = asyncio.get_running_loop()
        if self.store is not None:
            self._restore(time.time())
        for service in self.services:
            await service.start(self)
        # Before any client can connect: wills whose delay ran out while the gateway was down go out now
        # (services are up, so they see them too), and sessions that expired meanwhile end.
        self._expire(time.time())
        self._tick_handle = self._loop.call_later(1.0, self._tick)
        self._flush()

    async def stop(self) -> None:
        """Publish every will, disconnect every client (MQTT 5: 0x8B server shutting down), stop
        services, commit.

        A shutdown is the server closing connections without the clients' DISCONNECT, so their wills are
        due (MQTT 5 3.1.2.5); mosquitto 2.0 publishes them too, delayed ones included (the delay cannot
        run out on a server that is going away). They are published while every client is still
        connected, so each connected subscriber gets them before its own DISCONNECT, and durable
        sessions find them queued after the restart."""
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        now = time.time()
        for link in list(self.links):
            connection = link.connection
            session = connection.session
            if connection.state == CONNECTED and session is not None and session.connection is connection:
                will, session.will = session.will, None
                if will is not None:
                    self._publish_will(session.client_id, will, now)
        for client_id, will in self.wills.due(float("inf")):
            self._publish_will(client_id, will, now)
        for link in list(self.links):
            self._close(link, rc.SERVER_SHUTTING_DOWN, "server shutting down", abnormal=False)
        self._flush()
        for service in self.services:
            await service.stop()
        for task in list(self._tasks):
            task.cancel()
        if self.store is not None:
            self._commit()

    def reload_security(self, authenticator: Authenticator, acl: Acl | None) -> None:
        """SIGHUP: swap in freshly loaded credentials and rules (both built before calling)."""
        self.authenticator = authenticator
        self.acl = acl
        self.router.acl = acl

    # -- socket layer callbacks -----------------------------------------------------------------------

    def connection_made(self, link: Link) -> None:
        self.links.add(link)

    def data_received(self, link: Link, data: bytes, now: float) -> int:
        """Handle what ``data`` completes; returns the number of packets it completed (the socket layer
        ends a connection's read turn on it)."""
        connection = link.connection
        if connection.state == CLOSED:
            return 0
        self.stats.bytes_received += len(data)
        try:
            packets = connection.receive(data, now)
        except ProtocolError as exc:
            if exc.parsed and connection.session is not None and self._backlogs.get(connection) is None:
                self._process(link, exc.parsed, 0)  # what came before the bad bytes still counts
            self._fail(link, exc)
            return 0
        if not packets:
            return 0
        backlog = self._backlogs.get(connection)
        if backlog is not None:
            backlog.extend(packets)
            return len(packets)
        self._process(link, packets, 0)
        if self._since_flush >= EARLY_FLUSH_DELIVERIES:
            # The event loop may hand us many more reads before it runs the scheduled flush (libuv
            # reads a busy socket repeatedly); past this many deliveries, write now (the store
            # commits first, as always) so output and memory stay bounded.
            self._flush()
        return len(packets)

    def connection_lost(self, link: Link) -> None:
        self.links.discard(link)
        connection = link.connection
        self._release_publishers(connection)
        self._holding.pop(link, None)
        self._backlogs.pop(connection, None)
        was = connection.state
        connection.state = CLOSED
        if was == CONNECTED:
            self._disconnected(connection, time.time())
        self._schedule_flush()

    def congestion_changed(self, link: Link, congested: bool) -> None:
        """The socket layer's flow control: a connection's write buffer went over its high-water mark
        (publishers feeding it get held back from now on), or it drained or was declared overloaded
        (those publishers are released)."""
        if congested:
            self._held_back.setdefault(link.connection, set())
        else:
            self._release_publishers(link.connection)

    def _hold_back(self, publisher: Link, target: Connection) -> None:
        held = self._held_back.get(target)
        if held is None:
            # Congested by its queue rather than its socket: the socket layer's grace timer does not
            # run, so set our own; a client that does not acknowledge must not stall its publishers.
            held = self._held_back[target] = set()
            if target.session is not None:
                self._arm_queue_grace(target, target.session.completed)
        if publisher not in held and publisher.connection is not target:
            held.add(publisher)
            count = self._holding.get(publisher, 0)
            self._holding[publisher] = count + 1
            if not count:
                publisher.hold_reading("backpressure", True)

    def _release_publishers(self, target: Connection) -> None:
        for publisher in self._held_back.pop(target, ()):
            count = self._holding.get(publisher, 0) - 1
            if count > 0:
                self._holding[publisher] = count
            else:
                self._holding.pop(publisher, None)
                publisher.hold_reading("backpressure", False)

    def _arm_queue_grace(self, target: Connection, completed: int) -> None:
        assert self._loop is not None
        self._loop.call_later(SLOW_CONSUMER_GRACE, self._queue_grace_over, target, completed)

    def _queue_grace_over(self, target: Connection, completed_before: int) -> None:
        """Publishers have waited SLOW_CONSUMER_GRACE for this client's queue. If it acknowledged
        anything meanwhile it is merely slower than they are: keep holding them. If not, it is stuck:
        a slow consumer, and the publishers go free (its QoS 1/2 messages still queue for it)."""
        session = target.session
        if target not in self._held_back or target.congested or session is None or target.state == CLOSED:
            return
        if session.completed != completed_before:
            self._arm_queue_grace(target, session.completed)
            return
        log.info("client %s: slow consumer, %d messages queued", target.client_id, len(session.queue))
        target.overloaded = True
        self._release_publishers(target)

    def _acknowledged(self, connection: Connection, session: Session) -> None:
        """After an acknowledgement: release publishers held back for this client's queue once it drained."""
        if len(session.queue) <= QUEUE_LOW_WATER and not connection.congested:
            connection.overloaded = False
            if connection in self._held_back:
                self._release_publishers(connection)

    def keepalive_expired(self, link: Link) -> None:
        log.info("client %s: keep-alive timeout", link.connection.client_id or link.connection.peer)
        self._close(link, rc.KEEP_ALIVE_TIMEOUT, "keep alive timeout")

    # -- packet dispatch ------------------------------------------------------------------------------

    def _process(self, link: Link, packets: Sequence[pk.Packet], start: int) -> None:
        connection = link.connection
        count = len(packets)
        index = start
        budget = start + TURN_PACKET_BUDGET
        try:
            while index < count:
                if index == budget:
                    # Fairness: one read can hold thousands of packets (a flooding publisher); the rest
                    # waits for later loop turns so every other client is served in between.
                    backlog = deque(packets[index:])
                    self._backlogs[connection] = backlog
                    link.hold_reading("backlog", True)
                    self._spawn(self._resume_after(link, None, backlog))
                    break
                packet = packets[index]
                index += 1
                if packet.type not in ALLOWED_PACKETS[connection.state]:
                    raise ProtocolError(rc.PROTOCOL_ERROR, f"unexpected packet type {packet.type}")
                pending = self._HANDLERS[packet.type](self, link, packet)
                if pending is not None:
                    backlog = deque(packets[index:])
                    self._backlogs[connection] = backlog
                    link.hold_reading("backlog", True)
                    self._spawn(self._resume_after(link, pending, backlog))
                    break
                if connection.state == CLOSED:
                    break
        except ProtocolError as exc:
            self._fail(link, exc)
        except Exception:
            # A bug must cost one connection, never the broker.
            log.exception("client %s (%s): internal error; closing", connection.client_id or "?", connection.peer)
            self._close(link, rc.UNSPECIFIED_ERROR, "internal error")
        self._mark(connection)

    async def _resume_after(self, link: Link, pending: Awaitable[None] | None, backlog: deque[pk.Packet]) -> None:
        """Handle a connection's backlog after ``pending`` (if any), TURN_PACKET_BUDGET packets per loop
        turn, while its socket does not read; then let it read again."""
        connection = link.connection
        try:
            if pending is not None:
                await pending
            handled = 0
            while backlog and connection.state != CLOSED:
                if handled == TURN_PACKET_BUDGET:
                    handled = 0
                    self._mark(connection)
                    await asyncio.sleep(0)
                    continue
                handled += 1
                packet = backlog.popleft()
                if packet.type not in ALLOWED_PACKETS[connection.state]:
                    raise ProtocolError(rc.PROTOCOL_ERROR, f"unexpected packet type {packet.type}")
                more = self._HANDLERS[packet.type](self, link, packet)
                if more is not None:
                    await more
        except ProtocolError as exc:
            self._fail(link, exc)
        except Exception:
            log.exception("client %s: internal error", connection.client_id or connection.peer)
            self._close(link, rc.UNSPECIFIED_ERROR, "internal error")
        finally:
            if self._backlogs.get(connection) is backlog:
                del self._backlogs[connection]
            if connection.state != CLOSED:
                link.hold_reading("backlog", False)
            self._mark(connection)

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coroutine)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- CONNECT --------------------------------------------------------------------------------------

    def _on_connect(self, link: Link, connect: pk.Connect) -> Awaitable[None] | None:
        connection = link.connection
        v5 = connect.protocol_level == pk.MQTT_5
        connection.protocol_level = connect.protocol_level
        connection.v5 = v5
        if v5 and pr.AUTHENTICATION_METHOD in connect.properties:
            self._refuse(link, rc.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported")
            return None
        client_id = connect.client_id
        if not client_id:
            if not v5 and not connect.clean_start:
                self._refuse(link, rc.CLIENT_IDENTIFIER_NOT_VALID, "empty client id needs a clean session")
                return None
        connection.state = AUTHENTICATING
        verdict = self.authenticator.check_cached(connect.username, connect.password)
        delay = self._flap_delay(client_id, time.monotonic()) if client_id else 0.0
        if verdict is not None and delay == 0.0:
            self._complete_connect(link, connect, verdict)
            return None
        return self._connect_later(link, connect, verdict, delay)

    async def _connect_later(self, link: Link, connect: pk.Connect, verdict: bool | None, delay: float) -> None:
        if delay:
            log.info("client %s: reconnecting too often, slowed down by %.1fs", connect.client_id, delay)
            await asyncio.sleep(delay)
        if verdict is None:
            assert self._loop is not None
            authenticator = self.authenticator
            verdict = await self._loop.run_in_executor(None, authenticator.check, connect.username, connect.password)
        if link.connection.state == CLOSED:
            return
        self._complete_connect(link, connect, verdict)

    def _flap_delay(self, client_id: str, now: float) -> float:
        """Session takeovers of one client id within FLAP_WINDOW beyond the first few slow it down."""
        if client_id not in self.sessions or self.sessions[client_id].connection is None:
            return 0.0
        history = self._takeovers.setdefault(client_id, deque())
        history.append(now)
        while history and history[0] < now - FLAP_WINDOW:
            history.popleft()
        excess = len(history) - FLAP_FREE_TAKEOVERS
        return 0.0 if excess <= 0 else min(FLAP_MAX_DELAY, 0.25 * 2 ** (excess - 1))

    def _refuse(self, link: Link, reason: int, why: str) -> None:
        connection = link.connection
        log.info("client %s (%s): connection refused: %s", connection.client_id or "?", connection.peer, why)
        properties = {pr.REASON_STRING: why} if connection.v5 else {}
        connection.out += encode(pk.Connack(False, reason, properties), connection.protocol_level)
        connection.state = CLOSED
        self._mark(connection)
        self._close_after_flush(link)

    def _complete_connect(self, link: Link, connect: pk.Connect, authorized: bool) -> None:
        connection = link.connection
        v5 = connection.v5
        if not authorized:
            reason = rc.BAD_USERNAME_OR_PASSWORD if connect.username is not None else rc.NOT_AUTHORIZED
            self._refuse(link, reason, "not authorized")
            return
        now = time.time()
        limits = self.limits
        client_id = connect.client_id
        connack_props: dict[int, Any] = {}
        if not client_id:
            client_id = f"auto-{uuid.uuid4()}"
            connack_props[pr.ASSIGNED_CLIENT_IDENTIFIER] = client_id
        keep_alive = connect.keep_alive
        if keep_alive > limits.max_keepalive or (keep_alive == 0 and v5 and limits.max_keepalive < 65535):
            keep_alive = limits.max_keepalive
            connack_props[pr.SERVER_KEEP_ALIVE] = keep_alive
        if v5:
            expiry = min(connect.properties.get(pr.SESSION_EXPIRY_INTERVAL, 0), limits.max_session_expiry)
            if expiry != connect.properties.get(pr.SESSION_EXPIRY_INTERVAL, 0):
                connack_props[pr.SESSION_EXPIRY_INTERVAL] = expiry
        else:
            expiry = 0 if connect.clean_start else min(NEVER_EXPIRES, limits.max_session_expiry)
        connection.accept_connect(connect, client_id, keep_alive, limits.max_inflight_messages)

        session = self.sessions.get(client_id)
        if session is not None and session.connection is not None:
            old_link = session.connection.link
            log.info("client %s: session taken over by a new connection from %s", client_id, connection.peer)
            self._close(old_link, rc.SESSION_TAKEN_OVER, "session taken over")
            session = self.sessions.get(client_id)
        self.wills.cancel(client_id)
        if session is not None and connect.clean_start:
            self._end_session(session)
            session = None
        session_present = session is not None
        if session is None:
            session = Session(client_id, limits.max_queued_messages)
            self.sessions[client_id] = session
        was_durable = session.durable
        session.expiry_interval = expiry
        session.will = connect.will
        session.username = connect.username
        connection.session = session
        connection.state = CONNECTED
        if self.store is not None and (expiry or was_durable):
            if expiry:
                session.journal = self.store
                self.store.save_session(self._stored_session(session, connection, None, session.will))
            else:
                self.store.delete_session(client_id)
                session.journal = None
                for delivery in list(session.inflight.values()) + list(session.queue):
                    delivery.seq = 0
        self.stats.clients_connected += 1
        self.stats.clients_total += 1
        if v5:
            connack_props[pr.RECEIVE_MAXIMUM] = limits.receive_maximum
            connack_props[pr.MAXIMUM_PACKET_SIZE] = limits.max_packet_size
            if limits.topic_alias_maximum:
                connack_props[pr.TOPIC_ALIAS_MAXIMUM] = limits.topic_alias_maximum
        connection.out += encode(pk.Connack(session_present, 0, connack_props), connection.protocol_level)
        if keep_alive:
            link.start_keepalive(keep_alive * 1.5)
        session.resume(connection, now)
        self._mark(connection)

    # -- PUBLISH (inbound) ----------------------------------------------------------------------------

    def _on_publish(self, link: Link, publish: pk.Publish) -> Awaitable[None] | None:
        connection = link.connection
        if connection.state != CONNECTED:
            raise ProtocolError(rc.PROTOCOL_ERROR, "PUBLISH before CONNACK")
        if connection.resolve_topic(publish):
            publish.frame = None
        self.stats.messages_received += 1
        session = connection.session
        assert session is not None
        qos = publish.qos
        packet_id = publish.packet_id
        if qos == 2 and packet_id in session.inbound_qos2:
            connection.out += encode_ack(pk.PUBREC, packet_id)  # a duplicate: acknowledged, not routed again
            return None
        properties = publish.properties
        if properties and pr.SUBSCRIPTION_IDENTIFIER in properties:
            raise ProtocolError(rc.PROTOCOL_ERROR, "PUBLISH from a client with a subscription identifier")
        if qos == 2 and len(session.inbound_qos2) >= self.limits.receive_maximum:
            raise ProtocolError(rc.RECEIVE_MAXIMUM_EXCEEDED, "too many unacknowledged QoS 2 messages")
        acl = self.acl
        if acl is not None and not acl.can_publish(connection.client_id, connection.username, publish.topic):
            log.info("client %s: publish to %r denied", connection.client_id, publish.topic)
            if qos:
                code = rc.NOT_AUTHORIZED if connection.v5 else 0
                connection.out += encode_ack(pk.PUBACK if qos == 1 else pk.PUBREC, packet_id, code)
            return None
        if self._service_filters:
            services = self._services_for(publish.topic)
            if services:
                return self._publish_via_services(link, publish, services)
        self._accept_publish(link, session, publish, ACCEPTED)
        return None

    def _accept_publish(self, link: Link, session: Session, publish: pk.Publish, verdict: PublishVerdict) -> None:
        connection = link.connection
        now = time.time()
        # A failure reason code means "not accepted": such a message is not routed either.
        if verdict.route and verdict.reason_code < 0x80:
            properties = publish.properties
            expires_at = None
            raw = publish.frame
            if properties:
                interval = properties.pop(pr.MESSAGE_EXPIRY_INTERVAL, None)
                if interval is not None:
                    expires_at = now + interval
                    raw = None
            message = Message(publish.topic, publish.payload, publish.qos, publish.retain, properties,
                              connection.client_id, expires_at, raw, connection.v5)
            self._route(message, now, link)
        qos = publish.qos
        if qos:
            code = verdict.reason_code if connection.v5 else 0
            properties_out = {pr.REASON_STRING: verdict.reason_string} if verdict.reason_string and connection.v5 else None
            if qos == 1:
                connection.out += encode_ack(pk.PUBACK, publish.packet_id, code, properties_out)
            else:
                if code < 0x80:
                    session.inbound_qos2.add(publish.packet_id)
                    if session.journal is not None and self.store is not None:
                        self.store.add_inbound_qos2(session.client_id, publish.packet_id)
                connection.out += encode_ack(pk.PUBREC, publish.packet_id, code, properties_out)

    def _services_for(self, topic: str) -> tuple[BrokerService, ...]:
        cached = self._service_cache.get(topic)
        if cached is None:
            if len(self._service_cache) > 65536:
                self._service_cache.clear()
            found: list[BrokerService] = []
            for topic_filter, service in self._service_filters:
                if service not in found and topic_matches(topic_filter, topic):
                    found.append(service)
            cached = self._service_cache[topic] = tuple(found)
        return cached

    async def _publish_via_services(self, link: Link, publish: pk.Publish, services: tuple[BrokerService, ...]) -> None:
        connection = link.connection
        session = connection.session
        assert session is not None
        properties = publish.properties
        inbound = InboundPublish(
            client_id=connection.client_id,
            username=connection.username,
            protocol_level=connection.protocol_level,
            topic=publish.topic,
            payload=publish.payload,
            qos=publish.qos,
            retain=publish.retain,
            user_properties=list(properties.get(pr.USER_PROPERTY, ())),
            content_type=properties.get(pr.CONTENT_TYPE),
            response_topic=properties.get(pr.RESPONSE_TOPIC),
            correlation_data=properties.get(pr.CORRELATION_DATA),
            message_expiry_interval=properties.get(pr.MESSAGE_EXPIRY_INTERVAL),
            payload_format_indicator=properties.get(pr.PAYLOAD_FORMAT_INDICATOR),
        )
        verdict = ACCEPTED
        for service in services:
            try:
                result = await service.on_publish(inbound)
            except Exception:
                log.exception("service %s failed on a publish to %r", type(service).__name__, publish.topic)
                result = PublishVerdict(rc.IMPLEMENTATION_SPECIFIC_ERROR, "service error")
            if result.reason_code >= 0x80 or not result.route or result.disconnect is not None:
                verdict = result
                break
            if result is not ACCEPTED:
                verdict = result
        if connection.state == CLOSED:
            # The publisher went away while the service worked; the message is still routed.
            if verdict.route:
                self._accept_publish(link, session, publish, verdict)
            return
        self._accept_publish(link, session, publish, verdict)
        if verdict.disconnect is not None:
            self._close(link, verdict.disconnect, verdict.reason_string or "closed by a service")

    # -- routing --------------------------------------------------------------------------------------

    def _route(self, message: Message, now: float, publisher: Link | None = None) -> None:
        if message.retain:
            self._retain(message)
        durable: list[tuple[Session, Delivery]] = []
        congested = self._congested_hits
        count = self.router.route(message, now, self._dirty, durable, congested)
        self.stats.messages_sent += count
        self._since_flush += count
        if durable:
            self._store_deliveries(message, durable)
        if congested:
            if publisher is not None:
                for connection in congested:
                    if not connection.overloaded:
                        self._hold_back(publisher, connection)
            congested.clear()
        if self._dirty and not self._flush_scheduled:
            self._schedule_flush()

    def _retain(self, message: Message) -> None:
        if not self.retained.update(message):
            return
        self.stats.retained_count = len(self.retained)
        if self.store is None or message.topic.startswith("$SYS/"):
            return  # $SYS values describe this run only; they are republished after a restart
        if message.payload:
            self.store.set_retained(
                RetainedMessage(message.topic, message.payload, message.qos, self._stored_properties(message),
                                message.expires_at)
            )
        else:
            self.store.delete_retained(message.topic)

    def _store_deliveries(self, message: Message, durable: list[tuple[Session, Delivery]]) -> None:
        store = self.store
        if store is None:
            return
        message_id = store.add_message(
            StoredMessage(message.topic, message.payload, self._stored_properties(message), message.expires_at)
        )
        for session, delivery in durable:
            delivery.seq = store.enqueue(session.client_id, message_id, delivery.qos, delivery.retain,
                                         delivery.subscription_ids or ())
            if delivery.packet_id:
                store.mark_publish_sent(delivery.seq, delivery.packet_id)

    @staticmethod
    def _stored_properties(message: Message) -> dict[str, Any]:
        return {STORED_PROPERTY_NAMES[k]: v for k, v in message.properties.items() if k in STORED_PROPERTY_NAMES}

    # -- acknowledgements -----------------------------------------------------------------------------

    def _on_puback(self, link: Link, packet: pk.PubAck) -> None:
        connection = link.connection
        session = connection.session
        if session is not None:
            session.on_puback(packet.packet_id, time.time())
            if connection.overloaded or self._held_back:
                self._acknowledged(connection, session)

    def _on_pubrec(self, link: Link, packet: pk.PubRec) -> None:
        session = link.connection.session
        if session is not None:
            session.on_pubrec(packet.packet_id, packet.reason_code, time.time())

    def _on_pubcomp(self, link: Link, packet: pk.PubComp) -> None:
        connection = link.connection
        session = connection.session
        if session is not None:
            session.on_pubcomp(packet.packet_id, time.time())
            if connection.overloaded or self._held_back:
                self._acknowledged(connection, session)

    def _on_pubrel(self, link: Link, packet: pk.PubRel) -> None:
        connection = link.connection
        session = connection.session
        assert session is not None
        packet_id = packet.packet_id
        if packet_id in session.inbound_qos2:
            session.inbound_qos2.discard(packet_id)
            if session.journal is not None and self.store is not None:
                self.store.remove_inbound_qos2(session.client_id, packet_id)
            connection.out += encode_ack(pk.PUBCOMP, packet_id)
        else:
            connection.out += encode_ack(pk.PUBCOMP, packet_id, rc.PACKET_IDENTIFIER_NOT_FOUND if connection.v5 else 0)

    # -- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------------------

    def _on_subscribe(self, link: Link, subscribe: pk.Subscribe) -> None:
        connection = link.connection
        session = connection.session
        assert session is not None
        v5 = connection.v5
        sub_ids = subscribe.properties.get(pr.SUBSCRIPTION_IDENTIFIER)
        sub_id = sub_ids[0] if sub_ids else None
        codes: list[int] = []
        retained_to_send: list[tuple[str, SubscriptionOptions]] = []
        now = time.time()
        for request in subscribe.subscriptions:
            topic_filter = request.topic_filter
            shared = topic_filter.startswith("$share/")
            if shared and request.no_local and v5:
                raise ProtocolError(rc.PROTOCOL_ERROR, "no local on a shared subscription")
            if self.acl is not None and not self.acl.can_subscribe(connection.client_id, connection.username, topic_filter):
                log.info("client %s: subscribe to %r denied", connection.client_id, topic_filter)
                codes.append(rc.NOT_AUTHORIZED if v5 else 0x80)
                continue
            options = SubscriptionOptions(request.qos, request.no_local, request.retain_as_published,
                                          request.retain_handling, sub_id)
            try:
                previous = self.tree.subscribe(connection.client_id, topic_filter, options)
            except TopicError as exc:
                log.info("client %s: bad topic filter %r: %s", connection.client_id, topic_filter, exc)
                codes.append(rc.TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            if session.journal is not None and self.store is not None:
                self.store.save_subscription(connection.client_id, topic_filter, options)
            codes.append(request.qos)
            if not shared and (request.retain_handling == 0 or (request.retain_handling == 1 and previous is None)):
                retained_to_send.append((topic_filter, options))
        connection.out += encode(pk.Suback(subscribe.packet_id, codes), connection.protocol_level)
        for topic_filter, options in retained_to_send:
            self._send_retained(session, topic_filter, options, now)

    def _send_retained(self, session: Session, topic_filter: str, options: SubscriptionOptions, now: float) -> None:
        for message in self.retained.matching(topic_filter, now):
            if self.acl is not None and not self.acl.can_receive(session.client_id, session.username, message.topic):
                continue
            ids = [options.subscription_identifier] if options.subscription_identifier is not None else None
            delivery = Delivery(message, min(message.qos, options.qos), True, ids)
            if session.deliver(delivery, now):
                self.stats.messages_sent += 1
                if delivery.qos and session.durable:
                    self._store_deliveries(message, [(session, delivery)])

    def _on_unsubscribe(self, link: Link, unsubscribe: pk.Unsubscribe) -> None:
        connection = link.connection
        session = connection.session
        assert session is not None
        codes = []
        for topic_filter in unsubscribe.topic_filters:
            removed = self.tree.unsubscribe(connection.client_id, topic_filter)
            if removed and session.journal is not None and self.store is not None:
                self.store.delete_subscription(connection.client_id, topic_filter)
            codes.append(rc.SUCCESS if removed else rc.NO_SUBSCRIPTION_EXISTED)
        connection.out += encode(pk.Unsuback(unsubscribe.packet_id, codes if connection.v5 else []), connection.protocol_level)

    # -- the rest -------------------------------------------------------------------------------------

    def _on_pingreq(self, link: Link, packet: pk.PingReq) -> None:
        link.connection.out += PINGRESP_BYTES

    def _on_disconnect(self, link: Link, packet: pk.Disconnect) -> None:
        connection = link.connection
        session = connection.session
        assert session is not None
        if connection.v5:
            expiry = packet.properties.get(pr.SESSION_EXPIRY_INTERVAL)
            if expiry is not None:
                if session.expiry_interval == 0 and expiry != 0:
                    raise ProtocolError(rc.PROTOCOL_ERROR, "session expiry set on DISCONNECT after connecting with 0")
                session.expiry_interval = min(expiry, self.limits.max_session_expiry)
        # MQTT 5 3.14.2.1: reason 0x04 means "disconnect, but do send my will".
        connection.clean_disconnect = packet.reason_code != rc.DISCONNECT_WITH_WILL
        connection.state = CLOSED
        self._disconnected(connection, time.time())
        self._close_after_flush(link)

    def _on_auth(self, link: Link, packet: pk.Auth) -> None:
        raise ProtocolError(rc.PROTOCOL_ERROR, "AUTH without enhanced authentication")

    _HANDLERS: dict[int, Callable[..., Awaitable[None] | None]] = {
        pk.CONNECT: _on_connect,
        pk.PUBLISH: _on_publish,
        pk.PUBACK: _on_puback,
        pk.PUBREC: _on_pubrec,
        pk.PUBREL: _on_pubrel,
        pk.PUBCOMP: _on_pubcomp,
        pk.SUBSCRIBE: _on_subscribe,
        pk.UNSUBSCRIBE: _on_unsubscribe,
        pk.PINGREQ: _on_pingreq,
        pk.DISCONNECT: _on_disconnect,
        pk.AUTH: _on_auth,
    }

    # -- ending connections and sessions --------------------------------------------------------------

    def _fail(self, link: Link, error: ProtocolError) -> None:
        """The one place bad input ends a connection: log it with the client id, tell the client why.

        Before CONNACK the answer is a CONNACK with the reason (MQTT 5) or return code (3.1.1, where only
        an unsupported protocol level has one); after it, an MQTT 5 client gets DISCONNECT.
        """
        connection = link.connection
        log.warning("client %s (%s): %s; closing", connection.client_id or "?", connection.peer, error)
        if connection.state == CLOSED:
            return
        if connection.state == AWAITING_CONNECT:
            level = connection.reader.protocol_level
            if level == pk.MQTT_5 or error.reason_code == rc.UNSUPPORTED_PROTOCOL_VERSION:
                connection.out += encode(pk.Connack(False, error.reason_code), level)
        self._close(link, error.reason_code, error.message)

    def _close(self, link: Link, reason: int, why: str, abnormal: bool = True) -> None:
        """End a connection: MQTT 5 clients past CONNECT get DISCONNECT(reason) first."""
        connection = link.connection
        if connection.state == CLOSED:
            return
        if connection.v5 and connection.state == CONNECTED:
            properties = {pr.REASON_STRING: why} if connection.request_problem_info else {}
            connection.out += encode(pk.Disconnect(reason, properties), pk.MQTT_5)
        was = connection.state
        connection.state = CLOSED
        if was == CONNECTED:
            connection.clean_disconnect = not abnormal
            self._disconnected(connection, time.time())
        self._mark(connection)
        self._close_after_flush(link)

    def _close_after_flush(self, link: Link) -> None:
        """Write what is pending for this connection (after committing: it may hold acks) and close."""
        connection = link.connection
        if connection.out:
            if self.store is not None:
                self._commit()
            link.write(bytes(connection.out))
            connection.out.clear()
        link.close()

    def _disconnected(self, connection: Connection, now: float) -> None:
        """The connection of a CONNECTED client ended, by whatever path; runs exactly once."""
        self.stats.clients_connected -= 1
        session = connection.session
        if session is None or session.connection is not connection:
            return
        session.detach(now)
        for service in self.services:
            try:
                service.on_client_disconnected(session.client_id)
            except Exception:
                log.exception("service %s failed in on_client_disconnected", type(service).__name__)
        will = session.will
        session.will = None
        delayed_will = None
        if will is not None and not connection.clean_disconnect:
            delay = will_delay(will, session.expiry_interval) if connection.v5 else 0
            if delay:
                self.wills.schedule(session.client_id, will, now + delay)
                delayed_will = will
            else:
                self._publish_will(session.client_id, will, now)
        if session.expiry_interval == 0:
            self._end_session(session)
        elif self.store is not None and session.journal is not None:
            # Only a will still waiting is stored: a restart before its time schedules it again.
            self.store.save_session(self._stored_session(session, connection, now, delayed_will))

    def _end_session(self, session: Session) -> None:
        self.tree.remove_client(session.client_id)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        if self.store is not None and (session.journal is not None or session.durable):
            self.store.delete_session(session.client_id)
        session.journal = None
        session.clear()

    def _publish_will(self, client_id: str, will: pk.Will, now: float) -> None:
        session = self.sessions.get(client_id)
        if self.store is not None and session is not None and session.journal is not None:
            self.store.clear_will(client_id)  # committed with the deliveries below: published once
        acl = self.acl
        if acl is not None:
            if not acl.can_publish(client_id, session.username if session is not None else None, will.topic):
                return
        properties = dict(will.properties)
        properties.pop(pr.WILL_DELAY_INTERVAL, None)
        interval = properties.pop(pr.MESSAGE_EXPIRY_INTERVAL, None)
        expires_at = now + interval if interval is not None else None
        self._route(Message(will.topic, will.payload, will.qos, will.retain, properties, client_id, expires_at), now)

    def _stored_session(self, session: Session, connection: Connection, disconnected_at: float | None,
                        will: pk.Will | None) -> StoredSession:
        stored_will = None
        if will is not None:
            stored_will = StoredWill(
                will.topic, will.payload, will.qos, will.retain,
                {STORED_PROPERTY_NAMES[k]: v for k, v in will.properties.items() if k in STORED_PROPERTY_NAMES},
                will.properties.get(pr.WILL_DELAY_INTERVAL, 0),
            )
        return StoredSession(session.client_id, connection.protocol_level, session.expiry_interval,
                             connection.username, disconnected_at, stored_will)

    # -- timers ---------------------------------------------------------------------------------------

    def _tick(self) -> None:
        """Once a second: due wills, expired sessions, ``$SYS``."""
        assert self._loop is not None
        now = time.time()
        try:
            self._expire(now)
            interval = self.limits.sys_interval
            if interval and now - self._last_sys >= interval:
                self._last_sys = now
                self.stats.publish_dropped = sum(s.dropped for s in self.sessions.values())
                for topic, payload in self.stats.snapshot(now):
                    self._route(Message(topic, payload, 0, True, {}, None), now)
        except Exception:
            log.exception("periodic broker tick failed")
        self._tick_handle = self._loop.call_later(1.0, self._tick)
        self._schedule_flush()

    def _expire(self, now: float) -> None:
        """Publish the wills whose delay is over; end the sessions that expired (a will still pending
        goes out first: MQTT 5 3.1.3.2.2, the session ending ends the delay)."""
        for client_id, will in self.wills.due(now):
            self._publish_will(client_id, will, now)
        for session in [s for s in self.sessions.values() if s.connection is None and s.disconnected_at is not None]:
            if session.expiry_interval != NEVER_EXPIRES and now >= session.disconnected_at + session.expiry_interval:
                pending = self.wills.cancel(session.client_id)
                if pending is not None:
                    self._publish_will(session.client_id, pending, now)
                self._end_session(session)

    # -- writing --------------------------------------------------------------------------------------

    def _mark(self, connection: Connection) -> None:
        if connection.out and not connection.flush_pending:
            connection.flush_pending = True
            self._dirty.append(connection)
            if not self._flush_scheduled:
                self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Commit the turn's changes, then write each connection's bytes once."""
        self._flush_scheduled = False
        if self.store is not None and not self._commit():
            assert self._loop is not None
            self._flush_scheduled = True
            self._loop.call_later(0.5, self._flush)
            return
        self._since_flush = 0
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = []
        sent = 0
        for connection in dirty:
            connection.flush_pending = False
            out = connection.out
            if out:
                sent += len(out)
                connection.link.write(bytes(out))
                out.clear()
        self.stats.bytes_sent += sent

    def _commit(self) -> bool:
        store = self.store
        assert store is not None
        if not store.has_pending:
            return True
        try:
            store.commit()
            return True
        except PersistenceError:
            log.exception("cannot commit the broker store; acknowledgements wait")
            return False

    # -- BrokerHandle ---------------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        *,
        user_properties: list[tuple[str, str]] | None = None,
        content_type: str | None = None,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        message_expiry_interval: int | None = None,
        payload_format_indicator: int | None = None,
    ) -> None:
        properties: dict[int, Any] = {}
        if payload_format_indicator is not None:
            properties[pr.PAYLOAD_FORMAT_INDICATOR] = payload_format_indicator
        if content_type is not None:
            properties[pr.CONTENT_TYPE] = content_type
        if response_topic is not None:
            properties[pr.RESPONSE_TOPIC] = response_topic
        if correlation_data is not None:
            properties[pr.CORRELATION_DATA] = correlation_data
        if user_properties:
            properties[pr.USER_PROPERTY] = list(user_properties)
        now = time.time()
        expires_at = now + message_expiry_interval if message_expiry_interval is not None else None
        self._route(Message(topic, payload, qos, retain, properties, None, expires_at), now)
        self._schedule_flush()

    def disconnect(self, client_id: str, reason_code: int, reason_string: str | None = None) -> None:
        session = self.sessions.get(client_id)
        if session is not None and session.connection is not None:
            self._close(session.connection.link, reason_code, reason_string or "disconnected by the server")

    # -- restart --------------------------------------------------------------------------------------

    def _restore(self, now: float) -> None:
        """Rebuild sessions, subscriptions, queues, retained messages and pending wills from the store."""
        assert self.store is not None
        state = self.store.load()
        messages: dict[int, Message] = {}
        for message_id, stored in state.messages.items():
            messages[message_id] = Message(stored.topic, stored.payload, 1, False, self._properties_from(stored.properties),
                                           None, stored.expires_at)
        for topic, retained in state.retained.items():
            self.retained.update(Message(topic, retained.payload, retained.qos, True,
                                         self._properties_from(retained.properties), None, retained.expires_at))
        self.stats.retained_count = len(self.retained)
        restored = 0
        for client_id, loaded in state.sessions.items():
            stored = loaded.session
            disconnected_at = stored.disconnected_at
            if disconnected_at is None:
                # The gateway died while this client was connected: an abnormal end, as of now.
                disconnected_at = now
                self.store.set_disconnected(client_id, now)
            if stored.will is not None:
                # Either that abnormal end, or a client that was already away and whose will was
                # still waiting out its delay: due at its original time (past times: at ``start``).
                will = stored.will
                props = self._properties_from(will.properties)
                if will.delay_interval:
                    props[pr.WILL_DELAY_INTERVAL] = will.delay_interval
                pending_will = pk.Will(will.topic, will.payload, will.qos, will.retain, props)
                delay = will_delay(pending_will, stored.expiry_interval)
                self.wills.schedule(client_id, pending_will, disconnected_at + delay)
            # Sessions that expired while the gateway was down are restored too: ``start`` publishes
            # their wills (the ACL needs the session's user name) and then ends them.
            session = Session(client_id, self.limits.max_queued_messages)
            session.expiry_interval = stored.expiry_interval
            session.username = stored.username
            session.disconnected_at = disconnected_at
            session.journal = self.store
            session.inbound_qos2 = set(loaded.inbound_qos2)
            for topic_filter, options in loaded.subscriptions.items():
                try:
                    self.tree.subscribe(client_id, topic_filter, options)
                except TopicError:
                    log.warning("client %s: dropping stored subscription %r", client_id, topic_filter)
            for entry in loaded.outbound:
                message = messages.get(entry.message_id)
                if message is None:
                    continue
                delivery = Delivery(message, entry.qos, entry.retain, list(entry.subscription_ids) or None)
                delivery.seq = entry.seq
                if entry.state != OutboundState.QUEUED and entry.packet_id:
                    delivery.packet_id = entry.packet_id
                    delivery.sent = True
                    delivery.released = entry.state == OutboundState.PUBREL_SENT
                session.restore(delivery)
            self.sessions[client_id] = session
            restored += 1
        if restored or state.retained:
            log.info("restored %d durable sessions and %d retained messages from %s", restored, len(state.retained),
                     self.store.path)

    @staticmethod
    def _properties_from(stored: dict[str, Any] | Any) -> dict[int, Any]:
        return {PROPERTY_IDS[name]: value for name, value in stored.items() if name in PROPERTY_IDS}
