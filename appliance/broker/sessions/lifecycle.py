"""How connections and sessions end: bad input, DISCONNECT, keep-alive, takeover, shutdown; wills and
session expiry.

Every way a connection ends goes through ``close`` (or ``fail`` for bad input, which logs it and maps
it to a reason code in one place) and then ``disconnected``, which runs exactly once per CONNECTED
connection: it detaches the session, tells the services, publishes or schedules the will, and ends a
session whose expiry is 0. Delayed wills and expired sessions are checked by ``expire`` from the
broker's one-second tick (``will.PendingWills``), not by a timer per client.

Time comes in as arguments (``now``: the wall-clock seconds of the batch being handled, read once by the
core, ``context.read_clock``) and through ``runtime.Runtime`` (the keep-alive timer, which reads its own
when it fires): no asyncio, no time module, so the broker-pair tests drive all of it with a fake clock.
"""

from __future__ import annotations

import logging

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reasons import MqttProtocolError
from appliance.broker.codec.writer import PINGRESP_BYTES, encode
from appliance.broker.context import HandlerContext, Instant
from appliance.broker.persistence import storage
from appliance.broker.routing.message import BrokerMessage
from appliance.broker.security.acl import reserved_for_the_broker
from appliance.broker.sessions.session import (
    AWAITING_CONNECT,
    CLOSED,
    CONNECTED,
    NEVER_EXPIRES,
    ClientConnection,
    Session,
)
from appliance.broker.sessions.will import will_delay
from appliance.broker.transport.link import Link

log = logging.getLogger("appliance.broker")


def fail(context: HandlerContext, link: Link, error: MqttProtocolError, now: float) -> None:
    """The one place bad input ends a connection: log it with the client id, tell the client why.

    Before CONNACK the answer is a CONNACK with the reason (MQTT 5) or return code (3.1.1, where only an
    unsupported protocol level has one); after it, an MQTT 5 client gets DISCONNECT.
    """
    connection = link.connection
    log.warning("client %s (%s): %s; closing", connection.client_id or "?", connection.peer, error)
    if connection.state == CLOSED:
        return
    if connection.state == AWAITING_CONNECT:
        level = connection.reader.protocol_level
        if level == pk.MQTT_5 or error.reason_code == rc.UNSUPPORTED_PROTOCOL_VERSION:
            connection.out += encode(pk.Connack(False, error.reason_code), level)
    close(context, link, error.reason_code, error.message, now)


def close(context: HandlerContext, link: Link, reason: int, why: str, now: float, abnormal: bool = True) -> None:
    """End a connection: MQTT 5 clients past CONNECT get DISCONNECT(reason) first. ``now``: the wall-clock
    reading of the batch that ends it (its will and its session's expiry count from it)."""
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
        disconnected(context, connection, now)
    context.mark(connection)
    context.close_after_flush(link)


def handle_disconnect(context: HandlerContext, link: Link, packet: pk.Disconnect, now: Instant) -> None:
    connection = link.connection
    session = connection.session
    assert session is not None
    if connection.v5:
        expiry = packet.properties.get(pr.SESSION_EXPIRY_INTERVAL)
        if expiry is not None:
            if session.expiry_interval == 0 and expiry != 0:
                raise MqttProtocolError(rc.PROTOCOL_ERROR, "session expiry set on DISCONNECT after connecting with 0")
            session.expiry_interval = min(expiry, context.limits.max_session_expiry)
    # MQTT 5 3.14.2.1: reason 0x04 means "disconnect, but do send my will".
    connection.clean_disconnect = packet.reason_code != rc.DISCONNECT_WITH_WILL
    connection.state = CLOSED
    disconnected(context, connection, now.wall)
    context.close_after_flush(link)


def disconnected(context: HandlerContext, connection: ClientConnection, now: float) -> None:
    """The connection of a CONNECTED client ended, by whatever path; runs exactly once."""
    context.stats.clients_connected -= 1
    session = connection.session
    if session is None or session.connection is not connection:
        return
    session.detach(now)
    for service in context.services:
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
            context.wills.schedule(session.client_id, will, now + delay)
            delayed_will = will
        else:
            publish_will(context, session.client_id, will, now)
    if session.expiry_interval == 0:
        end_session(context, session)
    elif context.store is not None and session.journal is not None:
        # Only a will still waiting is stored: a restart before its time schedules it again.
        context.store.save_session(storage.stored_session(session, connection, now, delayed_will))


def end_session(context: HandlerContext, session: Session) -> None:
    context.tree.remove_client(session.client_id)
    context.stats.dropped_by_ended_sessions += session.dropped  # what it lost stays counted (``count_drops``)
    session.dropped = 0
    if context.sessions.get(session.client_id) is session:
        del context.sessions[session.client_id]
    if context.store is not None and (session.journal is not None or session.durable):
        context.store.delete_session(session.client_id)
    session.journal = None
    session.pager = None
    session.clear()


def publish_will(context: HandlerContext, client_id: str, will: pk.Will, now: float) -> None:
    session = context.sessions.get(client_id)
    if context.store is not None and session is not None and session.journal is not None:
        context.store.clear_will(client_id)  # committed with the deliveries below: published once
    acl = context.acl
    topic = will.topic
    if (topic[0] == "$" and reserved_for_the_broker(topic)) or (
            acl is not None and not acl.can_publish(client_id, session.username if session is not None else None, topic)):
        return
    properties = dict(will.properties)
    properties.pop(pr.WILL_DELAY_INTERVAL, None)
    interval = properties.pop(pr.MESSAGE_EXPIRY_INTERVAL, None)
    expires_at = now + interval if interval is not None else None
    context.route(BrokerMessage(will.topic, will.payload, will.qos, will.retain, properties, client_id, expires_at), now)


def publish_wills_on_shutdown(context: HandlerContext, now: float) -> None:
    """A shutdown is the server closing connections without the clients' DISCONNECT, so their wills are
    due (MQTT 5 3.1.2.5); mosquitto 2.0 publishes them too, delayed ones included (the delay cannot run
    out on a server that is going away). They go out while every client is still connected, so each
    connected subscriber gets them before its own DISCONNECT, and durable sessions find them queued
    after the restart."""
    for link in list(context.links):
        connection = link.connection
        session = connection.session
        if connection.state == CONNECTED and session is not None and session.connection is connection:
            will, session.will = session.will, None
            if will is not None:
                publish_will(context, session.client_id, will, now)
    for client_id, will in context.wills.due(float("inf")):
        publish_will(context, client_id, will, now)


def expire(context: HandlerContext, now: float) -> None:
    """Publish the wills whose delay is over; end the sessions that expired (a will still pending goes
    out first: MQTT 5 3.1.3.2.2, the session ending ends the delay)."""
    for client_id, will in context.wills.due(now):
        publish_will(context, client_id, will, now)
    for session in [s for s in context.sessions.values() if s.connection is None]:
        disconnected_at = session.disconnected_at
        if disconnected_at is None or session.expiry_interval == NEVER_EXPIRES:
            continue
        if now >= disconnected_at + session.expiry_interval:
            pending = context.wills.cancel(session.client_id)
            if pending is not None:
                publish_will(context, session.client_id, pending, now)
            end_session(context, session)


def tick(context: HandlerContext, now: float) -> None:
    """The broker's one-second tick: due wills, expired sessions, and ``$SYS`` every ``sys_interval``."""
    expire(context, now)
    interval = context.limits.sys_interval
    if interval and now - context.last_sys >= interval:
        context.last_sys = now
        count_drops(context)
        for topic, payload in context.stats.snapshot(now):
            context.route(BrokerMessage(topic, payload, 0, True, {}, None), now)


def count_drops(context: HandlerContext) -> None:
    """Bring the drop counters of ``broker.stats`` up to date (``$SYS``, the metrics endpoint)."""
    stats = context.stats
    stats.publish_dropped = stats.dropped_by_ended_sessions + sum(s.dropped for s in context.sessions.values())
    stats.queue_full = context.router.queue_full


# -- keep-alive -------------------------------------------------------------------------------------------


def start_keepalive(context: HandlerContext, link: Link, seconds: float, now: Instant) -> None:
    """Close the connection once it has sent nothing for ``seconds`` (``keepalive.KeepAlive``: one heap
    and one timer for every connection)."""
    context.keepalive.watch(link, seconds, now.monotonic)


def keepalive_expired(context: HandlerContext, link: Link) -> None:
    connection = link.connection
    if connection.state == CLOSED:
        return
    if link.unread_input():
        # Bytes from the client wait unread in its socket: the broker holds its reading (held back for a
        # congested subscriber, which lasts as long as that one makes progress, far past a keep-alive; its
        # own socket congested, a slow link; its packets waiting for a service's ``on_publish``). It sent
        # them, so the silence is the broker's: its period starts again, and what waits is read once the
        # hold ends. A client that sent nothing is closed as ever, held or not (as mosquitto, which reads
        # every socket, closes a client that neither reads nor sends).
        connection.last_received = context.runtime.monotonic()
        context.keepalive.watch(link, connection.keep_alive * 1.5, connection.last_received)
        return
    log.info("client %s: keep-alive timeout", connection.client_id or connection.peer)
    close(context, link, rc.KEEP_ALIVE_TIMEOUT, "keep alive timeout", context.runtime.now())  # a timer: its own reading
    context.schedule_flush()


def handle_pingreq(context: HandlerContext, link: Link, packet: pk.PingReq, now: Instant) -> None:
    link.connection.out += PINGRESP_BYTES
