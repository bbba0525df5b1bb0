"""Which handler takes which packet type, and the one loop that hands packets to them: mosquitto's
``read_handle.c`` as a table and a function.

Rules:

* ``handle_packets`` is the only dispatch loop. The core calls it for a fresh read, the backlog task
  (``sessions/backlog``) for what waited; both hand it the packets as a deque it takes from the front.
* Each packet is checked against the connection's state table (``session.ALLOWED_PACKETS``) first; a
  packet type the state does not allow is a protocol error, made by ``unexpected``, which also raises in
  its place the error of bad bytes that followed good packets in the same read (``ReadFailure``, queued
  behind them so everything before them is handled first).
* The loop stops at a handler that returns an awaitable (the rest must not overtake it), after
  ``TURN_PACKET_BUDGET`` packets (fairness: one read can hold thousands), or when the connection closes.
  What is left stays in the deque for the backlog.
* Every error ends here: bad input is ``lifecycle.fail`` (the reason code, the log line), anything else
  a bug that costs one connection, never the broker.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reasons import MqttProtocolError
from appliance.broker.context import HandlerContext, Instant
from appliance.broker.handlers.connect import handle_auth, handle_connect
from appliance.broker.handlers.publish import (
    handle_puback,
    handle_pubcomp,
    handle_publish,
    handle_pubrec,
    handle_pubrel,
)
from appliance.broker.handlers.subscribe import handle_subscribe, handle_unsubscribe
from appliance.broker.sessions import lifecycle
from appliance.broker.sessions.session import ALLOWED_PACKETS, CLOSED
from appliance.broker.transport.link import Link

log = logging.getLogger("appliance.broker")

#: Packets of one connection handled per loop turn; the rest of a big read waits for the next turns.
TURN_PACKET_BUDGET = 128

#: A handler: (context, the client's link, the packet, the batch's clock reading) -> None, or an awaitable
#: the rest of the connection's packets wait for.
Handler = Callable[[HandlerContext, Link, Any, Instant], Awaitable[None] | None]

#: The dispatch table: packet type -> its handler (mosquitto's ``read_handle.c``).
HANDLERS: dict[int, Handler] = {
    pk.CONNECT: handle_connect,
    pk.PUBLISH: handle_publish,
    pk.PUBACK: handle_puback,
    pk.PUBREC: handle_pubrec,
    pk.PUBREL: handle_pubrel,
    pk.PUBCOMP: handle_pubcomp,
    pk.SUBSCRIBE: handle_subscribe,
    pk.UNSUBSCRIBE: handle_unsubscribe,
    pk.PINGREQ: lifecycle.handle_pingreq,
    pk.DISCONNECT: lifecycle.handle_disconnect,
    pk.AUTH: handle_auth,
}


class ReadFailure:
    """Bad bytes after good packets in one read, queued behind them: a packet type no state allows, so
    the dispatch loop reaches ``unexpected`` and raises the reader's error in its place."""

    __slots__ = ("error",)
    type = -1

    def __init__(self, error: MqttProtocolError) -> None:
        self.error = error


#: What waits in a connection's batch or backlog: framed packets, and at most one ``ReadFailure`` last.
Incoming = pk.Packet | ReadFailure


def unexpected(packet: pk.Packet | ReadFailure) -> MqttProtocolError:
    if isinstance(packet, ReadFailure):
        return packet.error
    return MqttProtocolError(rc.PROTOCOL_ERROR, f"unexpected packet type {packet.type}")


def handle_packets(context: HandlerContext, link: Link, packets: deque[Incoming], now: Instant,
                   budget: int = TURN_PACKET_BUDGET) -> Awaitable[None] | None:
    """Handle packets from the front of ``packets`` (see the module docstring); returns what the rest
    waits for, if a handler gave one. Packets left in ``packets`` with no awaitable returned and the
    connection open are the budget's: they wait for the next loop turn. ``budget``: what is left of the
    turn's (the short path may have taken packets of the same read already)."""
    connection = link.connection
    try:
        for _ in range(budget):  # a counted loop: the budget costs no bytecode per packet
            if not packets or connection.state == CLOSED:
                break
            packet = packets.popleft()
            if packet.type not in ALLOWED_PACKETS[connection.state]:
                raise unexpected(packet)
            pending = HANDLERS[packet.type](context, link, packet, now)
            if pending is not None:
                return pending
    except Exception as exc:  # ``failed`` tells bad input from a bug
        failed(context, link, exc, now.wall)
    return None


def failed(context: HandlerContext, link: Link, error: Exception, now: float) -> None:
    """Handling ``link``'s packets raised ``error``: bad input ends the connection with its reason code,
    a bug with 0x80 and a traceback in the log. ``now``: the batch's wall-clock reading."""
    if isinstance(error, MqttProtocolError):
        lifecycle.fail(context, link, error, now)
        return
    connection = link.connection
    log.error("client %s (%s): internal error; closing", connection.client_id or "?", connection.peer, exc_info=error)
    lifecycle.close(context, link, rc.UNSPECIFIED_ERROR, "internal error", now)
