"""The short path: the common PUBLISH and PUBACK handled in one function, from the read's bytes to the
subscribers' buffers, with the general path (``handlers/``, ``routing/router``, ``sessions/session``)
as the reference it must match byte for byte.

Why it exists: at a low message rate (issue 30: 2,000 msgs/s, one or two messages per read) every read
runs the broker's per-message path with cold caches, and what that costs grows with the number of
Python functions and objects a read touches, not with the bytecodes: the general path touches about 40
functions per message (reader, packet object, dispatch table, handler, ``BrokerMessage``, router,
``Delivery``, session, frame cache, ...). This path frames the packets itself, looks the topic up in a
route cache and writes the subscribers' frames by slicing the received bytes, in one function; it builds
a ``BrokerMessage`` and a ``Delivery`` only for what must outlive the read (a QoS 1 delivery in flight).
bench/RESULTS.md, "Issue 30, session 14", has the figures.

Rules (``tests/broker/test_short_path.py`` drives random sequences through the broker with this path on
and off and compares every byte each client gets and the broker's state):

* It takes a read from the front, one packet at a time, for as long as each packet is one it handles
  exactly as the general path would; at the first one it does not, it stops and the rest of the read
  goes to the general path (so a read is never handled out of order). It runs only for a CONNECTED
  connection with no bytes buffered in its reader and no backlog, and takes at most
  ``dispatch.TURN_PACKET_BUDGET`` packets (the general path gets what is left of the budget).
* A PUBLISH it takes: QoS 0 or 1, no DUP, no RETAIN, no properties (MQTT 5: an empty property block, so
  no topic alias, no expiry, no subscription identifier, nothing to forward but the frame), a non-empty
  topic of at most ``ROUTE_CACHE_TOPIC_BYTES``, a packet id that is not 0, at most the reader's maximum
  packet size; the publisher may publish to the topic (the ACL, asked for every message when there is
  one; never a topic only the broker writes, ``acl.reserved_for_the_broker``: its route says general);
  the store is not failing; no retained feed is running (``Router.live_topics``).
* A PUBACK it takes: the two-byte form (reason code 0, no properties), for a QoS 1 delivery not kept in
  the store, or for an id nothing is in flight with (ignored, as the general path ignores it). A read
  that is only such a PUBACK, with nothing to refill or release after it, goes to ``lone_puback`` before
  ``take``: the same change without the wall clock and ``take``'s setup (what a paced subscriber sends).
* Every subscriber of the message must be one it can serve, else the whole message goes the general
  way: an ordinary (not shared) subscription without subscription identifier, of a session that is
  online, whose queue is empty, whose connection is neither congested nor overloaded nor using outbound
  topic aliases, whose Maximum Packet Size takes the frame; for a QoS 1 delivery, a session that is not
  durable (no store write, so the PUBACK need not wait for a commit) with room in its Receive Maximum
  window. Then the delivery is exactly what ``Session.deliver`` would do: written at once.
* The ACL's read check runs for every delivery, from the ``Acl`` in force (``Broker.acl``), never from
  the cache; no-local is applied per message from the cached subscriptions' options.

The route cache maps a topic's bytes to its checked topic name and its subscribers (session, the
highest granted QoS, the highest without no-local subscriptions) and whether the general path must take
it (a shared subscription, a subscription identifier, a subscriber without a session, a service that
claims the topic). An entry is valid for the subscription tree's ``generation``, which every subscribe,
unsubscribe and session end bumps (``end_session`` removes the session's subscriptions), and emptied at
the first miss after a change, so that no stale entry holds on to an ended session; what can change
without one (a subscriber going offline, its window, its queue, the ACL, the store's health) is read
live for every message. The cache holds at most ``ROUTE_CACHE_TOPICS`` topics of at most
``ROUTE_CACHE_TOPIC_BYTES`` each and at most ``ROUTE_CACHE_BYTES`` of estimated size with their
subscribers (``cache_bounds``), and starts over when full, so a client publishing to random or long
topics cannot grow it, however many sessions subscribe to them.
"""

from __future__ import annotations

import struct

from appliance.broker.cache_bounds import MAX_CACHED_KEY_CHARS, BoundedCache
from appliance.broker.codec.packets import MQTT_5
from appliance.broker.codec.reader import PacketReader, remaining_length
from appliance.broker.codec.reasons import MqttProtocolError
from appliance.broker.codec.writer import puback_success
from appliance.broker.context import HandlerContext, Instant
from appliance.broker.handlers.dispatch import TURN_PACKET_BUDGET
from appliance.broker.handlers.publish import services_for
from appliance.broker.routing.delivery import Delivery
from appliance.broker.routing.message import BrokerMessage
from appliance.broker.security.acl import reserved_for_the_broker
from appliance.broker.sessions.session import ClientConnection, Session
from appliance.broker.transport.link import Link

#: Topics the route cache holds before it starts over.
ROUTE_CACHE_TOPICS = 4096
#: Longer topic names go the general path, so the cache's keys hold at most 4 MiB (a topic name may have
#: 65,535 bytes: 4,096 of those would be 256 MiB).
ROUTE_CACHE_TOPIC_BYTES = MAX_CACHED_KEY_CHARS
#: Estimated bytes of cached routes (keys, names and subscribers, ``cache_bounds``) before the cache
#: starts over: an entry holds every subscriber of its topic, so with 300 sessions subscribed to ``#`` a
#: publisher sending to 4,096 new topics made it 90 MB (the topic tree's match cache, which holds the
#: same subscribers, has the same budget).
ROUTE_CACHE_BYTES = 16 * 1024 * 1024
#: What a cached route costs besides its topic's bytes and subscribers (measured with tracemalloc: the
#: dict slot, the ``RouteEntry``, the key's bytes and the name's str headers, the targets tuple's header).
ROUTE_ENTRY_BYTES = 320
#: What each subscriber adds to a cached route: its ``Target`` tuple and the pointer to it.
ROUTE_TARGET_BYTES = 72

_U16 = struct.Struct(">H")

#: One subscriber of a topic: its session, the QoS granted to others' messages, and the QoS granted to
#: its own messages (-1: every matching subscription is no-local).
Target = tuple[Session, int, int]


class RouteEntry:
    """What the route cache knows about one topic (see the module docstring)."""

    __slots__ = ("generation", "targets", "topic", "topic_bytes")

    def __init__(self, generation: int, topic: str, topic_bytes: bytes, targets: tuple[Target, ...] | None) -> None:
        self.generation = generation
        self.topic = topic
        #: ``topic`` in UTF-8 (the cache's key), shared by every message on it.
        self.topic_bytes = topic_bytes
        #: None: the general path takes every message on this topic.
        self.targets = targets


class ShortPath:
    """The route cache and the function that handles a read, ``take`` (``lone_puback``: the paced
    subscriber's read; see the module docstring)."""

    def __init__(self, context: HandlerContext) -> None:
        self.context = context
        #: Bounded in entries and in bytes (``cache_bounds``); ``take`` reads ``routes``, its dict.
        self.route_cache: BoundedCache[bytes, RouteEntry] = BoundedCache(ROUTE_CACHE_TOPICS, ROUTE_CACHE_BYTES)
        self.routes = self.route_cache.entries
        #: The tree's generation the cache was last emptied at: the first miss after a change empties it,
        #: so no stale entry keeps an ended session alive.
        self.generation = 0

    def take(self, link: Link, data: bytes, now: Instant, touched: list[ClientConnection]) -> tuple[int, int, int]:
        """Handle packets from the front of ``data`` while the rules allow; returns (bytes taken, packets
        taken, deliveries made). ``touched`` gets each connection written to that is not yet waiting for
        a flush, as ``Router.route`` does."""
        context = self.context
        if context.store_failing or context.router.live_topics:
            return 0, 0, 0
        connection = link.connection
        session = connection.session
        assert session is not None
        routes = self.routes
        tree = context.tree
        acl = context.acl
        reader = connection.reader
        max_size = reader.max_packet_size
        v5 = connection.protocol_level == MQTT_5
        origin = connection.client_id
        out = connection.out
        sent_by_qos = context.router.sent_by_qos
        inflight_out = session.inflight
        end = len(data)
        pos = 0
        packets = 0
        deliveries = 0
        received = [0, 0]
        # The framing uses comparisons, ``*`` and ``+`` rather than ``&``, ``|``, ``<<`` and ``>>``: on Python
        # 3.11 those four are C calls (``PyNumber_And``, ``long_and``, ...) that nothing else of a paced
        # wake-up makes, so each is instruction cache lines fetched cold per read (bench/RESULTS.md, issue
        # 30, session 16).
        while end - pos >= 2 and packets < TURN_PACKET_BUDGET:
            first = data[pos]
            length = data[pos + 1]
            header = 2
            if length >= 0x80:
                # An incomplete or malformed remaining length is left to the general path.
                try:
                    length, header = remaining_length(data, pos, end)
                except MqttProtocolError:
                    break
                if not header:
                    break
            stop = pos + header + length
            if stop > end or header + length > max_size:
                break
            start = pos + header
            if first == 0x40 and length == 2:
                # PUBACK, short form: ``handle_puback`` and ``Session.on_puback``.
                packet_id = data[start] * 256 + data[start + 1]
                if not packet_id:
                    break
                delivery = inflight_out.get(packet_id)
                if delivery is not None and delivery.qos == 1:
                    if delivery.seq:
                        break  # kept in the store: the general path records its end
                    del inflight_out[packet_id]
                    session.completed += 1
                    if session.queue or session.spilled:
                        session.fill_window(now.wall)
                # ``handle_puback`` asks this for every PUBACK, known or not.
                if connection.overloaded or context.backpressure.held_back:
                    context.backpressure.acknowledged(connection, session)
                packets += 1
                pos = stop
                continue
            if first != 0x30 and first != 0x32:
                break
            qos = 1 if first == 0x32 else 0
            tlen = data[start] * 256 + data[start + 1] if length >= 2 else 0
            topic_end = start + 2 + tlen
            body = topic_end + 2 if qos else topic_end  # after the packet id
            if not tlen or tlen > ROUTE_CACHE_TOPIC_BYTES or body + (1 if v5 else 0) > stop:
                break
            if v5 and data[body] != 0:
                break  # a property: the general path
            packet_id = data[topic_end] * 256 + data[topic_end + 1] if qos else 0
            if qos and not packet_id:
                break
            raw_topic = data[start + 2 : topic_end]
            entry = routes.get(raw_topic)
            if entry is None or entry.generation != tree.generation:
                entry = self._route(raw_topic, reader)
                if entry is None:
                    break
            targets = entry.targets
            if targets is None:
                break
            topic = entry.topic
            if acl is not None and not acl.can_publish(origin, connection.username, topic):
                break
            raw = data[pos:stop]
            # Who gets it, and at which QoS (``Router._delivery``); all or nothing, before any change.
            plan: list[tuple[Session, ClientConnection, int]] = []
            for subscriber, granted, granted_own in targets:
                target = subscriber.connection
                if target is None:
                    break
                if acl is not None and not acl.can_receive(subscriber.client_id, subscriber.username, topic):
                    continue
                granted_qos = granted_own if subscriber.client_id == origin else granted
                if granted_qos < 0:
                    continue  # no-local
                if (subscriber.queue or target.overloaded or target.congested or (target.v5 and target.alias_maximum_out)
                        or len(raw) + 2 > target.max_outbound_packet):
                    break
                delivered_qos = granted_qos if granted_qos < qos else qos
                if delivered_qos and (subscriber.expiry_interval or subscriber.pager is not None
                                      or len(subscriber.inflight) >= target.send_quota):
                    break
                plan.append((subscriber, target, delivered_qos))
            else:
                message: BrokerMessage | None = None
                for subscriber, target, delivered_qos in plan:
                    same = target.v5 == v5 and delivered_qos == qos
                    if delivered_qos:
                        # ``Session._send_new``: the next free packet id, in flight from now on.
                        inflight = subscriber.inflight
                        new_id = subscriber._next_packet_id
                        while new_id in inflight:
                            new_id = new_id % 65535 + 1
                        subscriber._next_packet_id = new_id % 65535 + 1
                        if message is None:
                            message = BrokerMessage(topic, data[body + (1 if v5 else 0) : stop], qos, False, {}, origin,
                                                    None, raw, v5, entry.topic_bytes)
                        delivery = Delivery(message, 1, False, None)
                        delivery.packet_id = new_id
                        delivery.sent = True
                        inflight[new_id] = delivery
                        if same:
                            target.out += raw[: topic_end - pos] + _U16.pack(new_id) + raw[topic_end + 2 - pos :]
                        else:
                            target.out += message.frame(target.v5, 1, False, False, new_id, None, now.wall)
                    elif same:
                        target.out += raw
                    else:
                        if message is None:
                            message = BrokerMessage(topic, data[body + (1 if v5 else 0) : stop], qos, False, {}, origin,
                                                    None, raw, v5, entry.topic_bytes)
                        target.out += message.frame(target.v5, 0, False, False, None, None, now.wall)
                    sent_by_qos[delivered_qos] += 1
                    if not target.flush_pending:
                        target.flush_pending = True
                        touched.append(target)
                deliveries += len(plan)
                received[qos] += 1
                if qos:
                    out += puback_success(packet_id)
                packets += 1
                pos = stop
                continue
            break  # a subscriber the general path must serve
        if received[0] or received[1]:
            stats = context.stats
            stats.messages_received += received[0] + received[1]
            stats.received_by_qos[0] += received[0]
            stats.received_by_qos[1] += received[1]
            stats.messages_sent += deliveries
        return pos, packets, deliveries

    def lone_puback(self, connection: ClientConnection, data: bytes) -> bool:
        """A read that is one PUBACK in the short form and ends a QoS 1 delivery in flight with nothing
        else to do (no queue to refill, no publisher held back, not in the store): ``take``'s PUBACK branch
        for the case of a paced subscriber, done here without the clock's wall time, ``take``'s setup for
        PUBLISHes and its loop (a fifth fewer cache lines per paced PUBACK read, bench/RESULTS.md, issue
        30, session 16). Returns whether it handled the read; False changes nothing (``take`` then does)."""
        context = self.context
        if len(data) != 4 or data[0] != 0x40 or data[1] != 2 or context.store_failing or context.router.live_topics:
            return False
        session = connection.session
        assert session is not None
        inflight = session.inflight
        packet_id = data[2] * 256 + data[3]
        delivery = inflight.get(packet_id)
        if (delivery is None or delivery.qos != 1 or delivery.seq or session.queue or session.spilled
                or connection.overloaded or context.backpressure.held_back):
            return False
        del inflight[packet_id]
        session.completed += 1
        return True

    def _route(self, raw_topic: bytes, reader: PacketReader) -> RouteEntry | None:
        """Fill the route cache for a topic; None if its name is not valid (the general path says why)."""
        try:
            topic = reader.topic_name(raw_topic)
        except MqttProtocolError:
            return None
        context = self.context
        tree = context.tree
        cache = self.route_cache
        if self.generation != tree.generation:
            cache.clear()
            self.generation = tree.generation
        match = tree.match(topic)
        targets: tuple[Target, ...] | None = None
        if not match.shared and not (context.service_filters and services_for(context, topic)) and not (
                topic[0] == "$" and reserved_for_the_broker(topic)):  # the general path refuses it
            found: list[Target] = []
            sessions = context.sessions
            for client_id, subscriptions in match.subscribers.items():
                session = sessions.get(client_id)
                if session is None or any(s.options.subscription_identifier is not None for s in subscriptions):
                    break
                granted = max(s.options.qos for s in subscriptions)
                own = [s.options.qos for s in subscriptions if not s.options.no_local]
                found.append((session, granted, max(own) if own else -1))
            else:
                targets = tuple(found)
        entry = RouteEntry(tree.generation, topic, raw_topic, targets)
        size = len(raw_topic)
        # The key's bytes, then the name's (a str as long, ASCII), the entry and its subscribers.
        cache.put(raw_topic, entry, size, size + ROUTE_ENTRY_BYTES + (ROUTE_TARGET_BYTES * len(targets) if targets else 0))
        return entry
