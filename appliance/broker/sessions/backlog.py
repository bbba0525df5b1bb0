"""A connection's packets that wait their turn, while its socket does not read.

Two things make packets wait: a handler that must await something (checking a password, a service's
``on_publish``) - the packets after it must not overtake it - and a read so big that handling it at once
would starve every other client (``dispatch.TURN_PACKET_BUDGET`` packets per loop turn). Either way the rest of the
read goes into the connection's backlog, the socket stops reading (so the backlog cannot grow), and one
task works through it in order with the one dispatch loop (``dispatch.handle_packets``), a budget per
loop turn, then lets the socket read again.

Like the handlers it imports neither asyncio nor time: it awaits only what the runtime port gives it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable

from appliance.broker.context import HandlerContext, read_clock
from appliance.broker.handlers.dispatch import Incoming, failed, handle_packets
from appliance.broker.sessions.session import CLOSED, ClientConnection
from appliance.broker.transport.link import Link


class Backlogs:
    """Every connection's waiting packets, and the task that works through each."""

    def __init__(self, context: HandlerContext) -> None:
        self.context = context
        self.waiting: dict[ClientConnection, deque[Incoming]] = {}

    def forget(self, connection: ClientConnection) -> None:
        self.waiting.pop(connection, None)

    def hold(self, link: Link, pending: Awaitable[None] | None, backlog: deque[Incoming]) -> None:
        """Stop ``link`` reading and handle ``backlog`` after ``pending`` (if any) in later loop turns."""
        self.waiting[link.connection] = backlog
        link.hold_reading("backlog", True)
        self.context.runtime.spawn(self._resume_after(link, pending, backlog))

    async def _resume_after(self, link: Link, pending: Awaitable[None] | None, backlog: deque[Incoming]) -> None:
        context = self.context
        runtime = context.runtime
        connection = link.connection
        try:
            if pending is not None:
                await pending
            while backlog and connection.state != CLOSED:
                # Each pass is a batch of its own, with its own clock reading.
                pending = handle_packets(context, link, backlog, read_clock(runtime))
                if pending is not None:
                    await pending
                elif backlog:  # the turn's budget is spent: let every other client be served first
                    context.mark(connection)
                    await runtime.sleep(0)
        except Exception as exc:  # what an awaited step raised; ``failed`` tells bad input from a bug
            failed(context, link, exc, runtime.now())  # after an await: a reading of its own
        finally:
            if self.waiting.get(connection) is backlog:
                del self.waiting[connection]
            if connection.state != CLOSED:
                link.hold_reading("backlog", False)
            context.mark(connection)
