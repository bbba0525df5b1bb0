"""CONNECT (and AUTH): authenticate, take over or resume the session, answer CONNACK.

A password check may need PBKDF2, which runs through ``runtime.run_blocking`` (a worker thread) once
``broker.login_gate`` admits it: a source address out of failure tokens is refused at once (MQTT 5
CONNACK 0x9F Connection rate exceeded, 3.1.1 return code 3), a check waits for one of a few slots, and a
check whose client left while it waited is skipped (``login_gate`` says why). A client id reconnecting
too often (session takeovers inside FLAP_WINDOW) is slowed down with ``runtime.sleep``. Either way
``handle_connect`` returns an awaitable and the broker core holds the rest of the connection's packets
until it is done, so they keep their order. No asyncio, no time module: ``now`` (the batch's ``Instant``, wall-clock and
monotonic) and the runtime come in from the core; after an await it is read again (a new batch).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable
from typing import Any

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reasons import MqttProtocolError
from appliance.broker.codec.writer import encode
from appliance.broker.context import HandlerContext, Instant, read_clock
from appliance.broker.persistence import storage, store_failure
from appliance.broker.sessions import lifecycle
from appliance.broker.sessions.session import (
    AUTHENTICATING,
    CLOSED,
    CONNECTED,
    NEVER_EXPIRES,
    Session,
)
from appliance.broker.transport.link import Link

log = logging.getLogger("appliance.broker")

#: Session takeovers of one client id inside this window count as flapping.
FLAP_WINDOW = 10.0
FLAP_FREE_TAKEOVERS = 3
FLAP_MAX_DELAY = 5.0
#: Client ids whose takeover history is kept. Past this many, histories with nothing left inside
#: FLAP_WINDOW (they slow nobody down) are forgotten, and if all are recent all are: before, every client
#: id ever taken over stayed, so distinct (up to 64 KB) ids grew the map without end (``cache_bounds``).
TAKEOVER_HISTORIES = 256


def handle_connect(context: HandlerContext, link: Link, connect: pk.Connect, now: Instant) -> Awaitable[None] | None:
    connection = link.connection
    v5 = connect.protocol_level == pk.MQTT_5
    connection.protocol_level = connect.protocol_level
    connection.v5 = v5
    if v5 and pr.AUTHENTICATION_METHOD in connect.properties:
        refuse(context, link, rc.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported")
        return None
    client_id = connect.client_id
    if not client_id and not v5 and not connect.clean_start:
        refuse(context, link, rc.CLIENT_IDENTIFIER_NOT_VALID, "empty client id needs a clean session")
        return None
    connection.state = AUTHENTICATING
    verdict = context.authenticator.check_cached(connect.username, connect.password)
    delay = flap_delay(context, client_id, now.monotonic) if client_id else 0.0
    if verdict is not None and delay == 0.0:
        complete_connect(context, link, connect, verdict, now)
        return None
    if verdict is None:
        refusal = context.login_gate.admit(connection.peer, now.monotonic)
        if refusal is not None:
            why = "too many failed logins from this address" if refusal == rc.CONNECTION_RATE_EXCEEDED else "busy"
            refuse(context, link, refusal, why)
            return None
    return _connect_later(context, link, connect, verdict, delay)


async def _connect_later(context: HandlerContext, link: Link, connect: pk.Connect, verdict: bool | None, delay: float) -> None:
    runtime = context.runtime
    if delay:
        log.info("client %s: reconnecting too often, slowed down by %.1fs", connect.client_id, delay)
        await runtime.sleep(delay)
    checked = verdict is None
    if checked:
        verdict = await _check_password(context, link, connect)
    now = read_clock(runtime)  # after the awaits: a new batch, one reading for all of it
    if checked and verdict:
        context.login_gate.succeeded(link.connection.peer, now.monotonic)  # whether or not the client stayed
    if verdict is None or link.connection.state == CLOSED:
        return
    complete_connect(context, link, connect, verdict, now)


async def _check_password(context: HandlerContext, link: Link, connect: pk.Connect) -> bool | None:
    """The PBKDF2 check in one of the gate's slots; None if the client left before its turn came."""
    gate, runtime = context.login_gate, context.runtime
    turn = runtime.waiter()

    def wake() -> None:
        turn.set_result(None)

    if not gate.enter(wake):
        try:
            await turn
        except BaseException:  # cancelled (shutdown): give up the place or the slot, never leak it
            gate.abandon(wake)
            raise
    try:
        if link.connection.state == CLOSED or link.peer_closed():
            gate.skipped += 1
            return None
        verdict = await runtime.run_blocking(context.authenticator.check, connect.username, connect.password)
    finally:
        gate.leave()
    return verdict


def flap_delay(context: HandlerContext, client_id: str, now: float) -> float:
    """Session takeovers of one client id within FLAP_WINDOW beyond the first few slow it down."""
    session = context.sessions.get(client_id)
    if session is None or session.connection is None:
        return 0.0
    takeovers = context.takeovers
    history = takeovers.get(client_id)
    if history is None:
        if len(takeovers) >= TAKEOVER_HISTORIES:
            forget_old_takeovers(takeovers, now)
        history = takeovers[client_id] = deque()
    history.append(now)
    while history and history[0] < now - FLAP_WINDOW:
        history.popleft()
    excess = len(history) - FLAP_FREE_TAKEOVERS
    return 0.0 if excess <= 0 else min(FLAP_MAX_DELAY, 0.25 * 2 ** (excess - 1))


def forget_old_takeovers(takeovers: dict[str, deque[float]], now: float) -> None:
    """Drop the histories with no takeover inside FLAP_WINDOW; all of them if every one is recent."""
    for client_id in [client_id for client_id, history in takeovers.items() if history[-1] < now - FLAP_WINDOW]:
        del takeovers[client_id]
    if len(takeovers) >= TAKEOVER_HISTORIES:
        takeovers.clear()


def refuse(context: HandlerContext, link: Link, reason: int, why: str, level: int = logging.INFO,
           client_id: str | None = None) -> None:
    """Answer a CONNACK with ``reason`` and close; logged with the client id (``client_id`` before the
    connection has one) and the address."""
    connection = link.connection
    log.log(level, "client %s (%s): connection refused: %s", connection.client_id or client_id or "?", connection.peer,
            why)
    connection.out += encode(pk.Connack(False, reason, {pr.REASON_STRING: why}), connection.protocol_level)
    connection.state = CLOSED
    context.mark(connection)
    context.close_after_flush(link)


def complete_connect(context: HandlerContext, link: Link, connect: pk.Connect, authorized: bool,
                     now: Instant) -> None:
    connection = link.connection
    v5 = connection.v5
    if not authorized:
        # WARNING, naming the user and (in ``refuse``) the address: what an operator needs to tell a
        # misconfigured device from someone guessing passwords (the login gate bounds the lines per address).
        if connect.username is not None:
            refuse(context, link, rc.BAD_USERNAME_OR_PASSWORD, f"bad user name or password for user {connect.username!r}",
                   logging.WARNING, connect.client_id)
        else:
            refuse(context, link, rc.NOT_AUTHORIZED, "not authorized: no user name given", logging.WARNING,
                   connect.client_id)
        return
    owned = context.sessions.get(connect.client_id) if connect.client_id else None
    if owned is not None and owned.username != connect.username:
        # A session belongs to the user name that created it: another user may neither resume it (its
        # queued messages) nor take it over (closing the owner's connection). docs/broker-security.md
        refuse(context, link, rc.NOT_AUTHORIZED, "client id in use by another user")
        return
    limits = context.limits
    client_id = connect.client_id
    connack_props: dict[int, Any] = {}
    if not client_id:
        import uuid  # here, not with the module: uuid (and platform, which it imports) cost every gateway start ~3 ms of CPU

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
    if context.store_failing and store_failure.connect_needs_write(context, client_id, expiry):
        # Not logged per client: the store's failure is logged once (``store_health``).
        context.store_health.refused += 1
        refuse(context, link, store_failure.failure_code(context), store_failure.WHY, logging.DEBUG)
        return
    revision = context.commits.revision()
    connection.accept_connect(connect, client_id, keep_alive, limits.max_inflight_messages)

    session = context.sessions.get(client_id)
    if session is not None and session.connection is not None:
        log.info("client %s: session taken over by a new connection from %s", client_id, connection.peer)
        lifecycle.close(context, session.connection.link, rc.SESSION_TAKEN_OVER, "session taken over", now.wall)
        session = context.sessions.get(client_id)
    context.wills.cancel(client_id)
    if session is not None and connect.clean_start:
        lifecycle.end_session(context, session)
        session = None
    session_present = session is not None
    if session is None:
        session = Session(client_id, limits.max_queued_messages, context.queue_bytes_limit)
        session.receive_check = context.receive_check()
        context.sessions[client_id] = session
    was_durable = session.durable
    session.expiry_interval = expiry
    session.will = connect.will
    session.username = connect.username
    connection.session = session
    connection.state = CONNECTED
    store = context.store
    if store is not None and (expiry or was_durable):
        if expiry:
            storage.make_durable(context, session)
            store.save_session(storage.stored_session(session, connection, None, session.will))
        else:
            session.unspill()
            store.delete_session(client_id)
            session.journal = None
            for delivery in list(session.inflight.values()) + list(session.queue):
                delivery.seq = 0
    context.stats.clients_connected += 1
    context.stats.clients_total += 1
    if v5:
        connack_props[pr.RECEIVE_MAXIMUM] = limits.receive_maximum
        connack_props[pr.MAXIMUM_PACKET_SIZE] = limits.max_packet_size
        if limits.topic_alias_maximum:
            connack_props[pr.TOPIC_ALIAS_MAXIMUM] = limits.topic_alias_maximum
    start = len(connection.out)
    connection.out += encode(pk.Connack(session_present, 0, connack_props), connection.protocol_level)
    context.commits.hold(connection, revision, start)
    if keep_alive:
        lifecycle.start_keepalive(context, link, keep_alive * 1.5, now)
    session.resume(connection, now.wall)
    context.mark(connection)
    log.info("client %s (%s): connected%s over MQTT %s%s", client_id, connection.peer,
             f" as user {connect.username!r}" if connect.username is not None else "", "5" if v5 else "3.1.1",
             ", session resumed" if session_present else "")


def handle_auth(context: HandlerContext, link: Link, packet: pk.Auth, now: Instant) -> None:
    raise MqttProtocolError(rc.PROTOCOL_ERROR, "AUTH without enhanced authentication")
