"""The broker core: packet dispatch, the flush that commits before it writes, the periodic tick, and
``BrokerHandle`` for the in-process services.

What each packet does lives in one module per packet family, as mosquitto's ``handle_*.c`` files:
``handlers/connect``, ``handlers/publish`` (with the PUBACK/PUBREC/PUBREL/PUBCOMP flows),
``handlers/subscribe``, switched by ``handlers/dispatch`` (the table and the one dispatch loop); how
connections and sessions end (DISCONNECT, wills, expiry, keep-alive) is ``sessions/lifecycle``; holding
publishers back for congested clients is ``sessions/backpressure``; packets that wait for an awaited step
or the next loop turn are ``sessions/backlog``; what goes into ``broker.db`` and how a restart reads it
back is ``persistence/storage``. Those modules see this class only as a ``context.HandlerContext`` (the
state they may touch and the ``Output`` port) and import neither asyncio nor time: the clock and the
scheduler come in through ``runtime.Runtime``, so tests drive them with a fake clock
(``tests/broker/pair.py``).

Theory of operation
-------------------

* Throughput in Python is per-message work, so the unit of work is a *batch*: the socket layer hands over
  every packet of one read, they are all handled with one reading of the clock (``context.Instant``,
  wall and monotonic), and each connection that got bytes is queued for ONE flush. The flush
  (``call_soon``, once per loop turn) first commits the store, then writes every connection's buffer: a
  QoS 1/2 PUBACK/PUBREC can only leave after the message it acknowledges is on disk ("we commit before
  we ack"). If the commit fails, only the acknowledgements
  that waited on it are answered as failures; everything else is written as usual (``store_failure``).
* The common PUBLISH and PUBACK at the front of a read take the short path (``short_path``): one function
  from the read's bytes to the subscribers' buffers, held byte for byte to the general path below by
  ``tests/broker/test_short_path.py``; the first packet it cannot take exactly as the general path would
  and the rest of the read go the general path (``_read_general``).
* Everything synchronous stays synchronous. Two steps must wait: checking a password and a service's
  ``on_publish``. A handler then returns an awaitable; the rest of that connection's batch waits in a
  backlog and its socket stops reading until the step is done, so one client's packets keep their order
  and other clients never wait.
* Errors from bad input are ``MqttProtocolError``s with a reason code; ``lifecycle.fail`` is the one place
  that turns one into a DISCONNECT (MQTT 5) or a plain close (3.1.1) and a log line with the client id.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.broker.api import BrokerService
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reasons import MqttProtocolError
from appliance.broker.config import DEFAULT_QUEUED_BYTES_CAP, BrokerConfig
from appliance.broker.context import Instant, read_clock
from appliance.broker.handlers.dispatch import TURN_PACKET_BUDGET, Incoming, ReadFailure, handle_packets
from appliance.broker.persistence import storage
from appliance.broker.persistence.store import BrokerStore
from appliance.broker.persistence.store_failure import CommitGate
from appliance.broker.routing.message import BrokerMessage
from appliance.broker.routing.retain import RetainedMessages
from appliance.broker.routing.retained_feed import RetainedFeeds
from appliance.broker.routing.router import Router
from appliance.broker.routing.topic_tree import MATCH_CACHE_BYTES, SubscriptionTree, topic_matches
from appliance.broker.security.acl import DECISION_CACHE_BYTES, Acl, reserved_for_the_broker
from appliance.broker.security.auth import Authenticator
from appliance.broker.security.login_gate import LoginGate
from appliance.broker.sessions import lifecycle
from appliance.broker.sessions.backlog import Backlogs
from appliance.broker.sessions.backpressure import SLOW_CONSUMER_GRACE, Backpressure
from appliance.broker.sessions.keepalive import KeepAlive
from appliance.broker.sessions.session import (
    CLOSED,
    CONNECTED,
    ClientConnection,
    Delivery,
    Session,
)
from appliance.broker.sessions.will import PendingWills
from appliance.broker.short_path import ROUTE_CACHE_BYTES, ShortPath
from appliance.broker.sys_topics import BrokerStats
from appliance.broker.transport.link import Link
from appliance.prometheus import Family
from appliance.runtime import Runtime, Timer

__all__ = ["SLOW_CONSUMER_GRACE", "Broker", "Link"]

log = logging.getLogger("appliance.broker")

#: Deliveries buffered since the last flush after which a read writes at once instead of waiting.
EARLY_FLUSH_DELIVERIES = 2000
#: A small read the short path takes whole is written at its end instead of in the loop turn's flush when
#: no read with something to write began in the last ``QUIET_READ_GAP`` seconds (``_after_whole_read``).
#: The event loop runs the reads of one turn back to back, each within one read's handling of the last
#: (10-150 us here, warm to cold), so such a read is alone in its turn and there is nothing to coalesce it
#: with; at 2,000 msgs/s (issue 30) a read comes every 0.5-1 ms. A busy turn's reads are written by its
#: flush, once per connection; under a flood a read fills the 4 KiB buffer and is never "small". (The
#: read's own clock reading is the stamp: a read reads the clock once, ``context.read_clock``.)
QUIET_READ_GAP = 250e-6
LONE_READ_BYTES = 1024


class Broker:
    """One broker instance; implements ``api.BrokerHandle``."""

    def __init__(
        self,
        config: BrokerConfig,
        store: BrokerStore | None,
        authenticator: Authenticator,
        acl: Acl | None,
        services: Sequence[BrokerService] = (),
        runtime: Runtime | None = None,
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.store = store
        self.authenticator = authenticator
        self.acl = acl
        self.services = list(services)
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self.tree = SubscriptionTree(config.limits.max_topic_levels)
        self.sessions: dict[str, Session] = {}
        self.router = Router(self.tree, self.sessions, acl)
        #: ``max_queued_bytes`` as resolved (``gateway.resolve_queued_bytes``): the bound of each durable
        #: session's stored deliveries.
        self.queue_bytes_limit = config.limits.max_queued_bytes if config.limits.max_queued_bytes is not None \
            else DEFAULT_QUEUED_BYTES_CAP
        self.retained = RetainedMessages()
        self.retained_feeds = RetainedFeeds(self)
        self.wills = PendingWills()
        self.stats = BrokerStats(started_at=0.0)
        self.links: set[Link] = set()
        self.backpressure = Backpressure(self.runtime)
        self.service_filters = [(f, s) for s in self.services for f in s.topic_filters]
        self.service_cache: dict[str, tuple[BrokerService, ...]] = {}
        self.login_gate = LoginGate()  # survives SIGHUP: slots in use and failure counts are not the file's
        #: Recent session takeovers per client id (``handle_connect.flap_delay``).
        self.takeovers: dict[str, deque[float]] = {}
        self.keepalive = KeepAlive(self.runtime, lambda link: lifecycle.keepalive_expired(self, link))
        self._dirty: list[ClientConnection] = []
        self._flush_scheduled = False
        self._since_flush = 0
        #: When the last read the short path took whole and that had something to write began (monotonic).
        self._last_output_read = float("-inf")
        self.backlogs = Backlogs(self)
        self._tick_timer: Timer | None = None
        #: The last commit failed: requests that need a write are refused (kept by ``CommitGate``).
        self.store_failing = False
        #: Commits, their health, and the acknowledgements that wait on them (``store_failure``).
        self.commits = CommitGate(self, log)
        self.store_health = self.commits.health
        #: When ``$SYS`` was last published (``lifecycle.tick``).
        self.last_sys = 0.0
        #: The common PUBLISH and PUBACK in one function (``short_path``); None: everything goes the
        #: general path (the reference the short path is tested against).
        self.short_path: ShortPath | None = ShortPath(self)

    # -- starting and stopping ------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the store, start services, start the periodic tick. Call before listeners accept."""
        now = self.runtime.now()
        self.stats.started_at = now
        if self.store is not None:
            storage.restore(self, now)
        for service in self.services:
            await service.start(self)
        # Before any client can connect: wills whose delay ran out while the gateway was down go out now
        # (services are up, so they see them too), and sessions that expired meanwhile end.
        lifecycle.expire(self, self.runtime.now())
        self._tick_timer = self.runtime.call_later(1.0, self._tick)
        self.flush()

    async def stop(self) -> None:
        """Publish every will, disconnect every client (MQTT 5: 0x8B server shutting down), stop
        services in the reverse of their start order (a service may use one started before it: the
        forwarding bridge drives the hardware's uplink LED until it stops), commit."""
        if self._tick_timer is not None:
            self._tick_timer.cancel()
        self.keepalive.stop()
        now = self.runtime.now()
        lifecycle.publish_wills_on_shutdown(self, now)
        for link in list(self.links):
            lifecycle.close(self, link, rc.SERVER_SHUTTING_DOWN, "server shutting down", now, abnormal=False)
        self.flush()
        for service in reversed(self.services):
            await service.stop()
        self.runtime.close()
        if self.store is not None:
            self.commit()
            self.commits.stop()

    def reload_security(self, authenticator: Authenticator, acl: Acl | None) -> None:
        """SIGHUP: swap in freshly loaded credentials and rules (both built before calling)."""
        self.authenticator = authenticator
        self.acl = acl
        self.router.acl = acl
        check = self.receive_check()
        for session in self.sessions.values():
            session.receive_check = check

    # -- socket layer callbacks -----------------------------------------------------------------------

    def connection_made(self, link: Link) -> None:
        connection = link.connection
        connection.last_received = self.runtime.monotonic()
        connection.reader.max_topic_levels = self.limits.max_topic_levels
        connection.reader.max_user_properties = self.limits.max_user_properties
        self.links.add(link)

    def data_received(self, link: Link, data: bytes) -> int:
        """Handle what ``data`` completes; returns the number of packets it completed (the socket layer
        ends a connection's read turn on it). The common PUBLISHes and PUBACKs at the front of a read go
        the short path (``short_path``); the rest of the read, the general one."""
        connection = link.connection
        if connection.state == CLOSED:
            return 0
        self.stats.bytes_received += len(data)
        short_path = self.short_path
        if (short_path is not None and connection.state == CONNECTED and not connection.reader.pending
                and connection not in self.backlogs.waiting):
            if data.__class__ is not bytes:
                data = bytes(data)
            if len(data) == 4 and short_path.lone_puback(connection, data):  # the length first: no call for the rest
                # What follows ``take`` below, for a read it took whole with no deliveries; the monotonic
                # clock is all it needs.
                monotonic = self.runtime.monotonic()
                connection.last_received = monotonic
                if connection.out and not connection.flush_pending:
                    connection.flush_pending = True
                    self._dirty.append(connection)
                if self._dirty:
                    self._after_whole_read(monotonic, len(data))
                return 1
            now = read_clock(self.runtime)
            consumed, taken, deliveries = short_path.take(link, data, now, self._dirty)
            if consumed:
                dirty = self._dirty
                connection.last_received = now.monotonic
                if deliveries:
                    self._since_flush += deliveries
                # ``mark`` without its ``schedule_flush``: ``_after_whole_read`` decides between writing now
                # and the turn's flush (inline: a frame less per wake-up).
                if connection.out and not connection.flush_pending:
                    connection.flush_pending = True
                    dirty.append(connection)
                if consumed == len(data):
                    if dirty:
                        self._after_whole_read(now.monotonic, len(data))
                    return taken
                if dirty and not self._flush_scheduled:
                    self.schedule_flush()
                taken += self._read_general(link, data[consumed:], now, TURN_PACKET_BUDGET - taken)
                if self._since_flush >= EARLY_FLUSH_DELIVERIES:
                    self.flush()
                return taken
            return self._read_general(link, data, now, TURN_PACKET_BUDGET)
        return self._read_general(link, data, read_clock(self.runtime), TURN_PACKET_BUDGET)

    def _after_whole_read(self, started: float, size: int) -> None:
        """A read of ``size`` bytes that began at ``started`` (monotonic) and that the short path took
        whole left bytes to write. A small read alone in its loop turn (no flush scheduled yet, and no
        such read began in the last ``QUIET_READ_GAP``) is written now, which spares the ``call_soon`` and
        the loop iteration before the flush; the flush commits first as always, and with no flush
        scheduled nothing of this turn waits for a commit (whatever buffers a store change or holds an
        acknowledgement schedules the flush). Any other read waits for the turn's flush, which writes each
        connection once for every read of the turn."""
        quiet = started - self._last_output_read >= QUIET_READ_GAP
        self._last_output_read = started
        if not self._flush_scheduled:
            if quiet and size <= LONE_READ_BYTES:
                self.flush()
                return
            self.schedule_flush()
        if self._since_flush >= EARLY_FLUSH_DELIVERIES:
            self.flush()

    def _read_general(self, link: Link, data: bytes, now: Instant, budget: int) -> int:
        """The general path for a read (or what the short path left of it)."""
        connection = link.connection
        try:
            packets = connection.receive(data, now.monotonic)
        except MqttProtocolError as exc:
            # What came before the bad bytes still counts, in order (a CONNECT gets its CONNACK, then the
            # DISCONNECT with the reason); nothing after them can be framed, so reading stops.
            link.hold_reading("input error", True)
            failure = ReadFailure(exc)
            backlog = self.backlogs.waiting.get(connection)
            if backlog is not None:
                backlog.extend(exc.parsed)
                backlog.append(failure)
            else:
                self._process(link, deque[Incoming]([*exc.parsed, failure]), now, budget)
            return 0
        if not packets:
            return 0
        backlog = self.backlogs.waiting.get(connection)
        if backlog is not None:
            backlog.extend(packets)
            return len(packets)
        self._process(link, deque(packets), now, budget)
        if self._since_flush >= EARLY_FLUSH_DELIVERIES:
            # The event loop may hand us many more reads before it runs the scheduled flush (libuv
            # reads a busy socket repeatedly); past this many deliveries, write now (the store commits
            # first, as always) so output and memory stay bounded.
            self.flush()
        return len(packets)

    def connection_lost(self, link: Link) -> None:
        self.links.discard(link)
        connection = link.connection
        self.backpressure.forget(link)
        self.backlogs.forget(connection)
        self.commits.forget(connection)
        self.keepalive.forget(connection)
        was = connection.state
        connection.state = CLOSED
        if was == CONNECTED:
            lifecycle.disconnected(self, connection, self.runtime.now())
        self.schedule_flush()

    def congestion_changed(self, link: Link, congested: bool) -> None:
        """The socket layer's flow control: a connection's write buffer went over its high-water mark
        (publishers feeding it get held back from now on, for at most SLOW_CONSUMER_GRACE), or drained."""
        if congested:
            self.backpressure.socket_congested(link.connection)
        else:
            self.backpressure.socket_drained(link.connection)

    # -- packet dispatch ------------------------------------------------------------------------------

    def _process(self, link: Link, packets: deque[Incoming], now: Instant, budget: int = TURN_PACKET_BUDGET) -> None:
        """A fresh batch: handle what the dispatch loop can now; what it leaves waits in the backlog."""
        pending = handle_packets(self, link, packets, now, budget)
        if pending is not None or (packets and link.connection.state != CLOSED):
            self.backlogs.hold(link, pending, packets)
        self.mark(link.connection)

    def receive_check(self) -> Callable[[Session, str], bool] | None:
        """A session's check of each delivery as it leaves: None while there is no ACL (per delivery)."""
        return self.may_receive if self.acl is not None else None

    def may_receive(self, session: Session, topic: str) -> bool:
        """The ACL's read check for a delivery leaving now (the ACL in force at that moment: a SIGHUP may
        have replaced it since the message was queued)."""
        acl = self.acl
        return acl is None or acl.can_receive(session.client_id, session.username, topic)

    # -- routing --------------------------------------------------------------------------------------

    def route(self, message: BrokerMessage, now: float, publisher: Link | None = None) -> bool:
        """Deliver ``message`` to every matching session (and retain it if asked); store the deliveries
        to durable sessions; hold ``publisher`` back for congested receivers. False if a QoS 1/2
        delivery was dropped because a receiver's queue is full (the publisher gets 0x97)."""
        if message.retain:
            if self.store_failing and storage.stores_retained(self, message):
                self.store_health.refused += 1  # delivered, but not kept: the change could not be stored
            elif self.retained.update(message):
                self.stats.retained_count = len(self.retained)
                storage.store_retained(self, message)
        durable: list[tuple[Session, Delivery]] = []
        congested = self.backpressure.congested_hits
        router = self.router
        queue_full = router.queue_full
        count = router.route(message, now, self._dirty, durable, congested)
        self.stats.messages_sent += count
        self._since_flush += count
        if durable:
            # Even while the store fails (a will, a service's publish: what reaches this point then needs
            # no acknowledgement): an away session's deliveries live only in the store, which keeps them
            # buffered until a commit succeeds.
            storage.store_deliveries(self, message, durable, now)
        if congested:
            self.backpressure.after_route(publisher)
        if self._dirty and not self._flush_scheduled:
            self.schedule_flush()
        return router.queue_full == queue_full

    # -- the store's health ---------------------------------------------------------------------------

    def metrics(self) -> list[Family]:
        """The broker's figures for the gateway's Prometheus page: clients, messages, drops and the store's
        health."""
        lifecycle.count_drops(self)
        return [*self.stats.families(self.router.sent_by_qos), *self.store_health.families("broker"), *self.cache_families()]

    def cache_families(self) -> list[Family]:
        """What the shared caches keyed by what clients send hold, against their byte budgets
        (``cache_bounds``; docs/broker-security.md): a cache near its budget under a normal load means the
        gateway sees more distinct topics than the budget was made for."""
        acl_bytes = self.acl.cache_bytes if self.acl is not None else 0
        route_bytes = self.short_path.route_cache.held_bytes if self.short_path is not None else 0
        caches = (("topic_match", self.tree.cache_bytes, MATCH_CACHE_BYTES),
                  ("acl_decisions", acl_bytes, DECISION_CACHE_BYTES),
                  ("short_path_routes", route_bytes, ROUTE_CACHE_BYTES))
        return [
            Family("appliance_broker_cache_bytes", "gauge", "estimated bytes held by a cache keyed by client input",
                   [({"cache": name}, held) for name, held, _ in caches]),
            Family("appliance_broker_cache_limit_bytes", "gauge", "the bytes past which that cache starts over",
                   [({"cache": name}, limit) for name, _, limit in caches]),
        ]

    # -- the periodic tick ----------------------------------------------------------------------------

    def _tick(self) -> None:
        """Once a second: due wills, expired sessions, ``$SYS``."""
        try:
            self.store_health.tick(self.runtime.monotonic())
            self.stats.store_health(self.store_health)
            lifecycle.tick(self, self.runtime.now())
        except Exception:
            log.exception("periodic broker tick failed")
        self._tick_timer = self.runtime.call_later(1.0, self._tick)
        self.schedule_flush()

    # -- writing --------------------------------------------------------------------------------------

    def mark(self, connection: ClientConnection) -> None:
        """``connection`` has bytes to write: include it in the next flush."""
        if connection.out and not connection.flush_pending:
            connection.flush_pending = True
            self._dirty.append(connection)
            if not self._flush_scheduled:
                self.schedule_flush()

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.runtime.call_soon(self.flush)

    def flush(self) -> None:
        """Commit the turn's changes, then write each connection's bytes once (if the commit failed, the
        acknowledgements that depended on it are answered as failures: ``store_failure``)."""
        self._flush_scheduled = False
        store = self.store
        # ``has_pending`` is ``CommitGate.commit``'s own first check, asked here too so that a turn with
        # nothing to commit (every paced wake-up without a durable session) costs no call.
        committed = store is None or not store.has_pending or self.commits.commit()
        self._since_flush = 0
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = []
        sent = 0
        for connection in dirty:
            connection.flush_pending = False
            out = connection.out
            if not out:
                continue
            if connection.held_acks or not committed:
                sent += self._write(connection, committed)
            else:
                # ``_write`` without its commit cases, inline: a frame less per connection and turn.
                sent += len(out)
                connection.link.write(bytes(out))
                out.clear()
        self.stats.bytes_sent += sent

    def _write(self, connection: ClientConnection, committed: bool) -> int:
        # Only held acknowledgements need settling, and only a failed commit closes: no call otherwise.
        if connection.held_acks:
            self.commits.settle(connection, committed)
        out = connection.out
        sent = len(out)
        if out:
            connection.link.write(bytes(out))
            out.clear()
        if not committed:
            self.commits.close_if_refused(connection)
        return sent

    def close_after_flush(self, link: Link) -> None:
        """Write what is pending for this connection and close. The bytes may hold acknowledgements, so
        they leave only once the store committed; if it cannot, those are answered as failures or cut
        off (the client sends its unacknowledged QoS 1/2 messages again; the store keeps the changes for
        its next commit)."""
        connection = link.connection
        if connection.out:
            self._write(connection, self.store is None or self.commit())
        self.commits.forget(connection)
        link.close()

    def commit(self) -> bool:
        """Commit what is buffered; False if it failed (``CommitGate.commit``)."""
        return self.commits.commit()

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
        given = {pr.PAYLOAD_FORMAT_INDICATOR: payload_format_indicator, pr.CONTENT_TYPE: content_type,
                 pr.RESPONSE_TOPIC: response_topic, pr.CORRELATION_DATA: correlation_data,
                 pr.USER_PROPERTY: list(user_properties) if user_properties else None}
        properties: dict[int, Any] = {ident: value for ident, value in given.items() if value is not None}
        now = self.runtime.now()
        expires_at = now + message_expiry_interval if message_expiry_interval is not None else None
        self.route(BrokerMessage(topic, payload, qos, retain, properties, None, expires_at), now)
        self.schedule_flush()

    def may_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        if topic[:1] == "$" and reserved_for_the_broker(topic):
            return False
        acl = self.acl
        return acl is None or acl.can_publish(client_id, username, topic)

    def serves(self, topic: str) -> bool:
        return any(topic_matches(topic_filter, topic) for topic_filter, _ in self.service_filters)

    def disconnect(self, client_id: str, reason_code: int, reason_string: str | None = None) -> None:
        session = self.sessions.get(client_id)
        if session is not None and session.connection is not None:
            lifecycle.close(self, session.connection.link, reason_code, reason_string or "disconnected by the server",
                            self.runtime.now())
