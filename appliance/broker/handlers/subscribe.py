"""SUBSCRIBE and UNSUBSCRIBE: the ACL check, the subscription tree, the store, the retained messages a
new subscription gets (handed over a slice per loop turn by ``retained_feed``). Reason codes are written as
MQTT 5 knows them; the writer maps them to 3.1.1's (0x80 for any failure in SUBACK, none at all in UNSUBACK).
No asyncio, no time module.
"""

from __future__ import annotations

import logging

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reasons import MqttProtocolError
from appliance.broker.codec.writer import encode
from appliance.broker.context import HandlerContext, Instant
from appliance.broker.persistence import store_failure
from appliance.broker.routing.topic_tree import SubscriptionOptions, TopicError
from appliance.broker.transport.link import Link

log = logging.getLogger("appliance.broker")

#: Subscriptions one client may hold. A subscription costs its filter's text in the tree plus a stored
#: row for a durable session; without a bound, SUBSCRIBE after SUBSCRIBE grows the gateway's memory and
#: ``broker.db`` (and every restart's load) without end. Past it a new filter gets SUBACK 0x97 Quota
#: exceeded (MQTT 3.1.1: 0x80); replacing one the client holds is always allowed.
MAX_SUBSCRIPTIONS_PER_CLIENT = 10_000


def handle_subscribe(context: HandlerContext, link: Link, subscribe: pk.Subscribe, now: Instant) -> None:
    connection = link.connection
    session = connection.session
    assert session is not None
    sub_ids = subscribe.properties.get(pr.SUBSCRIPTION_IDENTIFIER)
    sub_id = sub_ids[0] if sub_ids else None
    codes: list[int] = []
    retained_to_send: list[tuple[str, SubscriptionOptions]] = []
    revision = context.commits.revision()
    unstorable = session.journal is not None and context.store_failing
    for request in subscribe.subscriptions:
        topic_filter = request.topic_filter
        shared = topic_filter.startswith("$share/")
        if shared and request.no_local and connection.v5:
            raise MqttProtocolError(rc.PROTOCOL_ERROR, "no local on a shared subscription")
        try:
            # Before anything else looks at it (the ACL, the store): a filter too deep costs nothing more.
            context.tree.check(topic_filter)
        except TopicError as exc:
            log.info("client %s: bad topic filter %.200r: %s", connection.client_id, topic_filter, exc)
            codes.append(rc.TOPIC_FILTER_INVALID)
            continue
        if context.tree.count_of(connection.client_id) >= MAX_SUBSCRIPTIONS_PER_CLIENT and not context.tree.holds(
            connection.client_id, topic_filter
        ):
            log.info("client %s: subscription to %.200r refused: %d subscriptions already", connection.client_id,
                     topic_filter, MAX_SUBSCRIPTIONS_PER_CLIENT)
            codes.append(rc.QUOTA_EXCEEDED)
            continue
        if unstorable:  # a durable session's subscription would have to be stored (3.1.1: 0x80 failure)
            context.store_health.refused += 1
            codes.append(store_failure.failure_code(context))
            continue
        if context.acl is not None and not context.acl.can_subscribe(connection.client_id, connection.username, topic_filter):
            log.info("client %s: subscribe to %r denied", connection.client_id, topic_filter)
            codes.append(rc.NOT_AUTHORIZED)
            continue
        options = SubscriptionOptions(request.qos, request.no_local, request.retain_as_published,
                                      request.retain_handling, sub_id)
        previous = context.tree.subscribe(connection.client_id, topic_filter, options)
        if session.journal is not None and context.store is not None:
            context.store.save_subscription(connection.client_id, topic_filter, options)
        codes.append(request.qos)
        if not shared and (request.retain_handling == 0 or (request.retain_handling == 1 and previous is None)):
            retained_to_send.append((topic_filter, options))
    start = len(connection.out)
    connection.out += encode(pk.Suback(subscribe.packet_id, codes), connection.protocol_level)
    context.commits.hold(connection, revision, start)
    for topic_filter, options in retained_to_send:
        context.retained_feeds.start(session, topic_filter, options, now.wall)


def handle_unsubscribe(context: HandlerContext, link: Link, unsubscribe: pk.Unsubscribe, now: Instant) -> None:
    connection = link.connection
    session = connection.session
    assert session is not None
    codes: list[int] = []
    revision = context.commits.revision()
    if session.journal is not None and context.store_failing:
        refused = store_failure.unsubscribe_refused(context, link, len(unsubscribe.topic_filters), now.wall)
        if refused is None:
            return
        codes = refused
    else:
        for topic_filter in unsubscribe.topic_filters:
            removed = context.tree.unsubscribe(connection.client_id, topic_filter)
            context.retained_feeds.cancel(connection.client_id, topic_filter)
            if removed and session.journal is not None and context.store is not None:
                context.store.delete_subscription(connection.client_id, topic_filter)
            codes.append(rc.SUCCESS if removed else rc.NO_SUBSCRIPTION_EXISTED)
    start = len(connection.out)
    connection.out += encode(pk.Unsuback(unsubscribe.packet_id, codes), connection.protocol_level)
    context.commits.hold(connection, revision, start)
