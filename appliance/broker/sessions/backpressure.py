"""Backpressure: publishers held back for the clients their messages congest, and slow consumers.

A connection is congested when its socket's write buffer is over the high-water mark (the socket layer
says so) or its queue behind the Receive Maximum window is (``router.QUEUE_HIGH_WATER``). The publishers
whose messages go to it stop being read (TCP backpressure, lossless) until it drains, but only for
``SLOW_CONSUMER_GRACE`` seconds without progress: a client that long without reading (or, for a queue,
without acknowledging anything) is a slow consumer. It is marked ``overloaded`` (its QoS 0 messages are
dropped and counted, its QoS 1/2 messages still queue up to the session's bound) and the publishers run
free again, so one stuck client cannot stall the others.

All of that state lives here, and time comes in through ``runtime.Runtime``: no asyncio, no time
module, so the congestion tests in ``tests/broker/test_timing.py`` move a fake clock instead of waiting
two seconds.
"""

from __future__ import annotations

import logging

from appliance.broker.routing.router import QUEUE_LOW_WATER
from appliance.broker.sessions.session import CLOSED, MEMORY_QUEUE_BYTES, ClientConnection, Session
from appliance.broker.transport.link import Link
from appliance.runtime import Runtime, Timer

log = logging.getLogger("appliance.broker")

#: Seconds a congested client may hold its publishers back before it counts as a slow consumer.
SLOW_CONSUMER_GRACE = 2.0


class Backpressure:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        #: Congested connections -> the publisher links held back for them.
        self.held_back: dict[ClientConnection, set[Link]] = {}
        #: How many congested connections hold each publisher back.
        self.holding: dict[Link, int] = {}
        #: Filled by ``Router.route`` with the congested connections a message reached.
        self.congested_hits: list[ClientConnection] = []
        self._socket_timers: dict[ClientConnection, Timer] = {}

    # -- the socket layer's flow control --------------------------------------------------------------

    def socket_congested(self, target: ClientConnection) -> None:
        """``target``'s write buffer went over its high-water mark: hold back its publishers from now on,
        for at most SLOW_CONSUMER_GRACE."""
        self.held_back.setdefault(target, set())
        if target not in self._socket_timers:
            self._socket_timers[target] = self.runtime.call_later(SLOW_CONSUMER_GRACE, self._socket_grace_over, target)

    def socket_drained(self, target: ClientConnection) -> None:
        timer = self._socket_timers.pop(target, None)
        if timer is not None:
            timer.cancel()
        self.release(target)

    def _socket_grace_over(self, target: ClientConnection) -> None:
        self._socket_timers.pop(target, None)
        log.info("client %s: slow consumer, dropping its QoS 0 messages", target.client_id or target.peer)
        target.overloaded = True
        self.release(target)

    # -- publishers -----------------------------------------------------------------------------------

    def after_route(self, publisher: Link | None) -> None:
        """A message from ``publisher`` reached the connections in ``congested_hits``: hold it back for
        those that are not overloaded already."""
        congested = self.congested_hits
        if publisher is not None:
            for connection in congested:
                if not connection.overloaded:
                    self.hold_back(publisher, connection)
        congested.clear()

    def hold_back(self, publisher: Link, target: ClientConnection) -> None:
        held = self.held_back.get(target)
        if held is None:
            # Congested by its queue rather than its socket: no socket timer runs, so set our own; a
            # client that does not acknowledge must not stall its publishers.
            held = self.held_back[target] = set()
            if target.session is not None:
                self._arm_queue_grace(target, target.session.completed)
        if publisher not in held and publisher.connection is not target:
            held.add(publisher)
            count = self.holding.get(publisher, 0)
            self.holding[publisher] = count + 1
            if not count:
                publisher.hold_reading("backpressure", True)

    def release(self, target: ClientConnection) -> None:
        for publisher in self.held_back.pop(target, ()):
            count = self.holding.get(publisher, 0) - 1
            if count > 0:
                self.holding[publisher] = count
            else:
                self.holding.pop(publisher, None)
                publisher.hold_reading("backpressure", False)

    def acknowledged(self, connection: ClientConnection, session: Session) -> None:
        """After an acknowledgement: release publishers held back for this client's queue once it drained."""
        if not (connection.overloaded or self.held_back):
            return
        if len(session.queue) <= QUEUE_LOW_WATER and session.queued_bytes < MEMORY_QUEUE_BYTES // 4 and not connection.congested:
            connection.overloaded = False
            if connection in self.held_back:
                self.release(connection)

    def forget(self, link: Link) -> None:
        """The connection ended: it holds no one back and is held back by no one."""
        connection = link.connection
        timer = self._socket_timers.pop(connection, None)
        if timer is not None:
            timer.cancel()
        self.release(connection)
        self.holding.pop(link, None)

    # -- queue congestion -----------------------------------------------------------------------------

    def _arm_queue_grace(self, target: ClientConnection, completed: int) -> None:
        self.runtime.call_later(SLOW_CONSUMER_GRACE, self._queue_grace_over, target, completed)

    def _queue_grace_over(self, target: ClientConnection, completed_before: int) -> None:
        """Publishers have waited SLOW_CONSUMER_GRACE for this client's queue. If it acknowledged
        anything meanwhile it is merely slower than they are: keep holding them. If not, it is stuck:
        a slow consumer, and the publishers go free (its QoS 1/2 messages still queue for it)."""
        session = target.session
        if target not in self.held_back or target.congested or session is None or target.state == CLOSED:
            return
        if session.completed != completed_before:
            self._arm_queue_grace(target, session.completed)
            return
        log.info("client %s: slow consumer, %d messages queued", target.client_id, len(session.queue))
        target.overloaded = True
        self.release(target)
