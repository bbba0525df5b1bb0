"""A connection's packets that wait their turn, while its socket does not read.

Two things make packets wait: a handler that must await something (checking a password, a service's
``on_publish``) - the packets after it must not overtake it - and a read so big that handling it at once
would starve every other client (``TURN_PACKET_BUDGET`` packets per loop turn). Either way the rest of the
read goes into the connection's backlog, the socket stops reading (so the backlog cannot grow), and one
task works through it in order, a budget per loop turn, then lets the socket read again.

Like the handlers it imports neither asyncio nor time: it awaits only what the runtime port gives it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reasons import ProtocolError
from appliance.broker.handlers.dispatch import HANDLERS, unexpected
from appliance.broker.sessions import lifecycle
from appliance.broker.sessions.session import ALLOWED_PACKETS, CLOSED, Connection
from appliance.broker.transport.link import Link

if TYPE_CHECKING:
    from appliance.broker.broker import Broker

log = logging.getLogger("appliance.broker")

#: Packets of one connection handled per loop turn; the rest of a big read waits for the next turns.
TURN_PACKET_BUDGET = 128


class Backlogs:
    """Every connection's waiting packets, and the task that works through each."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.waiting: dict[Connection, deque[pk.Packet]] = {}

    def forget(self, connection: Connection) -> None:
        self.waiting.pop(connection, None)

    def hold(self, link: Link, pending: Awaitable[None] | None, backlog: deque[pk.Packet]) -> None:
        """Stop ``link`` reading and handle ``backlog`` after ``pending`` (if any) in later loop turns."""
        self.waiting[link.connection] = backlog
        link.hold_reading("backlog", True)
        self.broker.runtime.spawn(self._resume_after(link, pending, backlog))

    async def _resume_after(self, link: Link, pending: Awaitable[None] | None, backlog: deque[pk.Packet]) -> None:
        broker = self.broker
        connection = link.connection
        try:
            if pending is not None:
                await pending
            handled = 0
            now = broker.runtime.now()
            while backlog and connection.state != CLOSED:
                if handled == TURN_PACKET_BUDGET:
                    handled = 0
                    broker.mark(connection)
                    await broker.runtime.sleep(0)
                    now = broker.runtime.now()
                    continue
                handled += 1
                packet = backlog.popleft()
                if packet.type not in ALLOWED_PACKETS[connection.state]:
                    raise unexpected(packet)
                more = HANDLERS[packet.type](broker, link, packet, now)
                if more is not None:
                    await more
                    now = broker.runtime.now()
        except ProtocolError as exc:
            lifecycle.fail(broker, link, exc)
        except Exception:
            log.exception("client %s: internal error", connection.client_id or connection.peer)
            lifecycle.close(broker, link, rc.UNSPECIFIED_ERROR, "internal error")
        finally:
            if self.waiting.get(connection) is backlog:
                del self.waiting[connection]
            if connection.state != CLOSED:
                link.hold_reading("backlog", False)
            broker.mark(connection)
