"""Retained messages for new subscriptions, handed over a slice per loop turn.

A SUBSCRIBE that matches many retained messages (``#`` on a gateway holding 100,000) must not stop the
broker while they are found, queued and stored: it starts a *feed*, and each loop turn feeds at most
``TURN_BUDGET`` units of work (a tree level visited while looking for matches costs 1, a message handed
over ``DELIVERY_COST``), shared by every feed, round-robin over the clients being fed; the rest waits for
the next turn. (What handling it all in the SUBSCRIBE cost: bench/RESULTS.md, "Moved from docstrings".)

Rules
-----
* **Order.** A client's feeds run in SUBSCRIBE order; each hands its messages over oldest topic first. A
  live message that reaches the client while its feeds run is newer than the retained message of its
  topic: that retained message is then skipped (it would overwrite the newer value), so a client never
  sees an older value of a topic after a newer one.
* **Flow control.** Messages go through ``Session.deliver`` (the in-flight window, the queue bounds) and a
  feed waits while its client is congested, its queue is over ``router.QUEUE_HIGH_WATER`` or it is away:
  memory stays bounded by the client's pace, and nothing is dropped for being fed faster than it reads. A
  waiting feed is looked at again every ``WAIT_RETRY`` seconds.
* **End.** An UNSUBSCRIBE of the filter ends its feed (MQTT 5 3.10.4: nothing more is added for it); so
  does the end of the session. Deliveries to durable sessions are stored as they are handed over; a
  restart loses what a feed had not handed over yet (the subscription itself is stored).

Theory of operation
-------------------
Time and scheduling come from ``runtime.Runtime``: no asyncio, no time module.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from appliance.broker.context import HandlerContext
from appliance.broker.persistence import storage
from appliance.broker.routing.retain import RetainedMatches
from appliance.broker.routing.router import QUEUE_HIGH_WATER
from appliance.broker.routing.topic_tree import SubscriptionOptions
from appliance.broker.sessions.session import Delivery, Session

#: Work per loop turn for all feeds together: about 10 ms here (a delivery to a durable session with its
#: share of the commit costs ~20 us, a tree level visited ~1 us).
TURN_BUDGET = 10_000
DELIVERY_COST = 20
#: Seconds before feeds that all wait for their clients are looked at again.
WAIT_RETRY = 0.05


@dataclass(slots=True)
class _Feed:
    session: Session
    topic_filter: str
    options: SubscriptionOptions
    #: Started when the feed reaches the head of its client's line: a SUBSCRIBE of thousands of filters
    #: queues thousands of feeds, and each walk in progress holds a generator.
    matches: RetainedMatches | None = None


class RetainedFeeds:
    """Every feed still running, by client id (see the module docstring)."""

    def __init__(self, context: HandlerContext) -> None:
        self._context = context
        self._feeds: dict[str, deque[_Feed]] = {}
        self._scheduled = False
        #: What SUBSCRIBE handling may still feed at once before the next turn: a read of many SUBSCRIBEs
        #: (from many clients) does not add up to more than one turn's work.
        self._spare = TURN_BUDGET

    def __len__(self) -> int:
        return sum(len(feeds) for feeds in self._feeds.values())

    def start(self, session: Session, topic_filter: str, options: SubscriptionOptions, now: float) -> None:
        """Feed ``session`` the retained messages matching ``topic_filter`` (unshared), starting now."""
        client_id = session.client_id
        feeds = self._feeds.get(client_id)
        if feeds is None:
            feeds = self._feeds[client_id] = deque()
            self._context.router.live_topics[client_id] = set()
        feeds.append(_Feed(session, topic_filter, options))
        if len(feeds) == 1 and self._spare > 0:
            # Most filters match a handful of messages: they leave with the SUBACK, as they always did.
            self._spare -= self._feed(client_id, self._spare, now)
        if client_id in self._feeds:
            self._schedule(0.0)

    def cancel(self, client_id: str, topic_filter: str) -> None:
        """The client unsubscribed from ``topic_filter``: nothing more is fed for it."""
        feeds = self._feeds.get(client_id)
        if feeds is not None:
            for feed in [feed for feed in feeds if feed.topic_filter == topic_filter]:
                feeds.remove(feed)
            if not feeds:
                self._finish(client_id)

    def _schedule(self, delay: float) -> None:
        if not self._scheduled:
            self._scheduled = True
            runtime = self._context.runtime
            if delay:
                runtime.call_later(delay, self._turn)
            else:
                runtime.call_soon(self._turn)

    def _turn(self) -> None:
        self._scheduled = False
        now = self._context.runtime.now()
        budget = TURN_BUDGET
        for client_id in list(self._feeds):
            if budget <= 0:
                break
            budget -= self._feed(client_id, budget, now)
            feeds = self._feeds.pop(client_id, None)
            if feeds is not None:
                self._feeds[client_id] = feeds  # to the back of the line: round-robin across turns
        self._spare = TURN_BUDGET
        if self._feeds:
            self._schedule(0.0 if budget < TURN_BUDGET else WAIT_RETRY)

    def _feed(self, client_id: str, budget: int, now: float) -> int:
        """Feed one client's feeds for up to ``budget``; returns the work done (0: it waits)."""
        context = self._context
        feeds = self._feeds[client_id]
        live_topics = context.router.live_topics[client_id]
        used = 0
        while feeds and used < budget:
            feed = feeds[0]
            session = feed.session
            if context.sessions.get(client_id) is not session:
                feeds.clear()  # the session ended (or a clean start replaced it)
                break
            connection = session.connection
            if connection is None or connection.congested or len(session.queue) >= QUEUE_HIGH_WATER:
                break
            matches = feed.matches
            if matches is None:
                matches = feed.matches = context.retained.matches(feed.topic_filter)
            if not matches.complete:
                used += matches.find(budget - used)
                continue
            message = matches.next()
            if message is None:
                feeds.popleft()
                continue
            used += DELIVERY_COST
            if message.topic in live_topics or message.expired(now) or not context.may_receive(session, message.topic):
                continue
            options = feed.options
            ids = [options.subscription_identifier] if options.subscription_identifier is not None else None
            delivery = Delivery(message, min(message.qos, options.qos), True, ids)
            if session.deliver(delivery, now):
                context.stats.messages_sent += 1
                context.router.sent_by_qos[delivery.qos] += 1
                if delivery.qos and session.durable:
                    storage.store_deliveries(context, message, [(session, delivery)], now)
            context.mark(connection)
        if not feeds:
            self._finish(client_id)
        return used

    def _finish(self, client_id: str) -> None:
        del self._feeds[client_id]
        del self._context.router.live_topics[client_id]
