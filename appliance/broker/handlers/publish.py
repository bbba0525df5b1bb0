"""Inbound PUBLISH and the QoS 1/2 acknowledgement flows both ways (PUBACK, PUBREC, PUBREL, PUBCOMP).

An inbound publish is checked (topic alias, QoS 2 duplicate, Receive Maximum, ACL), offered to the
in-process services that claim its topic (awaited: a service that commits inside ``on_publish`` gets
"acknowledged means durable"), routed, and acknowledged. The acknowledgement goes into the connection's
buffer; the core commits the store before it writes that buffer. Reason codes are always written as
MQTT 5 knows them: the writer drops them for 3.1.1, which has none.

No asyncio, no time module: ``now`` comes from the core, once per batch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from appliance.broker.api import ACCEPTED, BrokerService, InboundPublish, PublishVerdict
from appliance.broker.cache_bounds import MAX_CACHED_KEY_CHARS
from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reasons import MqttProtocolError
from appliance.broker.codec.writer import encode_ack, puback_success
from appliance.broker.context import HandlerContext, Instant, read_clock
from appliance.broker.persistence import store_failure
from appliance.broker.routing.message import BrokerMessage
from appliance.broker.routing.topic_tree import topic_matches
from appliance.broker.security.acl import reserved_for_the_broker
from appliance.broker.sessions import lifecycle
from appliance.broker.sessions.session import CLOSED, CONNECTED, Session
from appliance.broker.transport.link import Link

log = logging.getLogger("appliance.broker")

#: Topics whose matching services are remembered; past this many the cache starts over. Topics over
#: ``MAX_CACHED_KEY_CHARS`` (1 KiB) are matched every time (a handful of ``topic_matches``), never kept,
#: so the cache holds at most 16 Mi characters of keys, ~20 MB (``cache_bounds``; a topic can be 64 KB).
SERVICE_CACHE_TOPICS = 16384


def handle_publish(context: HandlerContext, link: Link, publish: pk.Publish, now: Instant) -> Awaitable[None] | None:
    connection = link.connection
    if connection.state != CONNECTED:
        raise MqttProtocolError(rc.PROTOCOL_ERROR, "PUBLISH before CONNACK")
    # An alias travels in the properties, so a PUBLISH without any that names its topic has nothing to
    # resolve (the common case: no call per message).
    if (publish.properties or not publish.topic) and connection.resolve_topic(publish):
        publish.frame = None
    context.stats.messages_received += 1
    session = connection.session
    assert session is not None
    qos = publish.qos
    context.stats.received_by_qos[qos] += 1
    packet_id = publish.packet_id or 0  # None for QoS 0, where it is not used
    level = connection.protocol_level
    if qos == 2 and packet_id in session.inbound_qos2:
        connection.out += encode_ack(pk.PUBREC, packet_id, level)  # a duplicate: acknowledged, not routed again
        return None
    properties = publish.properties
    if properties and pr.SUBSCRIPTION_IDENTIFIER in properties:
        raise MqttProtocolError(rc.PROTOCOL_ERROR, "PUBLISH from a client with a subscription identifier")
    if qos == 2 and len(session.inbound_qos2) >= context.limits.receive_maximum:
        raise MqttProtocolError(rc.RECEIVE_MAXIMUM_EXCEEDED, "too many unacknowledged QoS 2 messages")
    acl = context.acl
    topic = publish.topic
    if (topic[0] == "$" and reserved_for_the_broker(topic)) or (
            acl is not None and not acl.can_publish(connection.client_id, connection.username, topic)):
        log.info("client %s: publish to %r denied", connection.client_id, topic)
        if qos:
            connection.out += encode_ack(pk.PUBACK if qos == 1 else pk.PUBREC, packet_id, level, rc.NOT_AUTHORIZED)
        return None
    if context.service_filters:
        services = services_for(context, publish.topic)
        if services:
            return _publish_via_services(context, link, publish, services)
    accept_publish(context, link, session, publish, ACCEPTED, now)
    return None


def accept_publish(context: HandlerContext, link: Link, session: Session, publish: pk.Publish, verdict: PublishVerdict,
                   now: Instant) -> None:
    connection = link.connection
    # Whether this PUBLISH buffered a change for the store, so that its acknowledgement waits on the
    # commit (``store_failure.CommitGate``): the store's revision read directly, since this runs per message.
    store = context.store
    revision = store.revision if store is not None else 0
    qos = publish.qos
    code = verdict.reason_code
    queued = True
    # A failure reason code means "not accepted": such a message is not routed either.
    if code < 0x80 and verdict.route:
        if qos and context.store_failing and store_failure.publish_needs_write(context, session, publish):
            store_failure.refuse_publish(context, link, publish, now.wall)
            return
        properties = publish.properties
        expires_at = None
        raw = publish.frame
        if properties:
            interval = properties.pop(pr.MESSAGE_EXPIRY_INTERVAL, None)
            if interval is not None:
                expires_at = now.wall + interval
                raw = None
        message = BrokerMessage(publish.topic, publish.payload, qos, publish.retain, properties,
                          connection.client_id, expires_at, raw, connection.v5)
        queued = context.route(message, now.wall, link)
    if not qos:
        return
    if code >= 0x80:
        if verdict.disconnect is not None and not connection.v5:
            return  # 3.1.1 cannot say no: closed by the caller without an acknowledgement, the client resends
    elif not queued:
        # Some subscriber's queue is full (max_queued_bytes): MQTT 5 says so (3.1.1 cannot).
        code = rc.QUOTA_EXCEEDED
    reason = verdict.reason_string
    properties_out = {pr.REASON_STRING: reason} if reason else None
    out = connection.out
    start = len(out)
    packet_id = publish.packet_id or 0  # QoS 1/2: the reader always sets it
    if qos == 1:
        if code or reason:
            out += encode_ack(pk.PUBACK, packet_id, connection.protocol_level, code, properties_out)
        else:
            out += puback_success(packet_id)
        if store is not None and store.revision != revision:
            connection.held_acks.append(start)  # ``CommitGate.hold``, inline
        return
    if code < 0x80:
        session.inbound_qos2.add(packet_id)
        if session.journal is not None and store is not None:
            store.add_inbound_qos2(session.client_id, packet_id)
    out += encode_ack(pk.PUBREC, packet_id, connection.protocol_level, code, properties_out)
    context.commits.hold(connection, revision, start)


def services_for(context: HandlerContext, topic: str) -> tuple[BrokerService, ...]:
    cache = context.service_cache
    cached = cache.get(topic)
    if cached is None:
        if len(cache) > SERVICE_CACHE_TOPICS:
            cache.clear()
        found: list[BrokerService] = []
        for topic_filter, service in context.service_filters:
            if service not in found and topic_matches(topic_filter, topic):
                found.append(service)
        cached = tuple(found)
        if len(topic) <= MAX_CACHED_KEY_CHARS:
            cache[topic] = cached
    return cached


async def _publish_via_services(context: HandlerContext, link: Link, publish: pk.Publish,
                                services: tuple[BrokerService, ...]) -> None:
    connection = link.connection
    session = connection.session
    assert session is not None
    properties = publish.properties
    inbound = InboundPublish(
        client_id=connection.client_id,
        username=connection.username,
        protocol_level=connection.protocol_level,
        topic=publish.topic,
        payload=publish.payload,
        qos=publish.qos,
        retain=publish.retain,
        user_properties=list(properties.get(pr.USER_PROPERTY, ())),
        content_type=properties.get(pr.CONTENT_TYPE),
        response_topic=properties.get(pr.RESPONSE_TOPIC),
        correlation_data=properties.get(pr.CORRELATION_DATA),
        message_expiry_interval=properties.get(pr.MESSAGE_EXPIRY_INTERVAL),
        payload_format_indicator=properties.get(pr.PAYLOAD_FORMAT_INDICATOR),
    )
    verdict = ACCEPTED
    for service in services:
        try:
            result = await service.on_publish(inbound)
        except Exception:
            log.exception("service %s failed on a publish to %r", type(service).__name__, publish.topic)
            result = PublishVerdict(rc.IMPLEMENTATION_SPECIFIC_ERROR, "service error")
        if result.reason_code >= 0x80 or not result.route or result.disconnect is not None:
            verdict = result
            break
        if result is not ACCEPTED:
            verdict = result
    now = read_clock(context.runtime)  # after the await: a new batch
    if connection.state == CLOSED:
        # The publisher went away while the service worked; the message is still routed.
        if verdict.route:
            accept_publish(context, link, session, publish, verdict, now)
        return
    accept_publish(context, link, session, publish, verdict, now)
    if verdict.disconnect is not None:
        lifecycle.close(context, link, verdict.disconnect, verdict.reason_string or "closed by a service", now.wall)


# -- acknowledgements -------------------------------------------------------------------------------------


def handle_puback(context: HandlerContext, link: Link, packet: pk.PubAck, now: Instant) -> None:
    connection = link.connection
    session = connection.session
    if session is not None:
        session.on_puback(packet.packet_id, now.wall)
        backpressure = context.backpressure
        if connection.overloaded or backpressure.held_back:  # per message: skip the call when nothing is held
            backpressure.acknowledged(connection, session)


def handle_pubrec(context: HandlerContext, link: Link, packet: pk.PubRec, now: Instant) -> None:
    session = link.connection.session
    if session is not None:
        session.on_pubrec(packet.packet_id, packet.reason_code, now.wall)


def handle_pubcomp(context: HandlerContext, link: Link, packet: pk.PubComp, now: Instant) -> None:
    connection = link.connection
    session = connection.session
    if session is not None:
        session.on_pubcomp(packet.packet_id, now.wall)
        context.backpressure.acknowledged(connection, session)


def handle_pubrel(context: HandlerContext, link: Link, packet: pk.PubRel, now: Instant) -> None:
    connection = link.connection
    session = connection.session
    assert session is not None
    packet_id = packet.packet_id
    if packet_id in session.inbound_qos2:
        if session.journal is not None and context.store_failing:
            store_failure.pubrel_refused(context, link, now.wall)
            return
        revision = context.commits.revision()
        session.inbound_qos2.discard(packet_id)
        if session.journal is not None and context.store is not None:
            context.store.remove_inbound_qos2(session.client_id, packet_id)
        start = len(connection.out)
        connection.out += encode_ack(pk.PUBCOMP, packet_id, connection.protocol_level)
        context.commits.hold(connection, revision, start)
    else:
        connection.out += encode_ack(pk.PUBCOMP, packet_id, connection.protocol_level, rc.PACKET_IDENTIFIER_NOT_FOUND)
