"""The MQTT 5 request/response envelope every in-process service answers through, checked in one place.

A service that answers requests (the state store, the firmware chunk service, the next one) publishes its
reply from inside the broker, to a topic the *requester* chose: the Response Topic. Done carelessly that
makes it a confused deputy, writing where the requester may not (a chunk service that echoes a requester's
text to a topic the ACL forbids her). So the envelope is not each service's business: a service declares
its ``EnvelopeRules`` and calls ``open_request``.

Rules
-----
``open_request`` checks, in this order:

1. the response topic, first: one that is not a topic name (a wildcard would reach every subscriber of the
   filter's range; NUL), a ``$`` topic (the broker's own), a topic any in-process service takes
   publishes on (``BrokerHandle.serves``: its own request topic, another service's, the forwarded
   ``devices/#``; the reply would skip that service and reach the topic's subscribers as a request no
   client made) or a prefix it publishes itself (the state store's notifications) is refused with 0x90
   and a DISCONNECT 0x90; one the
   requester may not itself publish to under the broker's ACL in force *now* (``BrokerHandle.may_publish``)
   with 0x87 and a DISCONNECT 0x87. Whatever else is wrong: there is nowhere to send an answer;
2. MQTT 5, QoS 1, a Response Topic, Correlation Data - otherwise PUBACK 0x83 and no reply;
3. the request's ``__protVer``, for services that speak the Azure IoT Operations RPC convention (absent
   means 1.0, any supported major is served, anything else is answered status 505 with
   ``__supProtMajVer`` and ``__requestProtVer``, as the SDK executors do).

Theory of operation
-------------------
``respond`` publishes the reply with the request's correlation data at QoS 1 (and ``__protVer`` where the
convention applies). It asks ``may_publish`` again at reply time: a service that queues requests (the
firmware service answers after everything else) may reply after a SIGHUP took the right away, and then it
drops the reply. Anything about the *payload* is the service's and is answered on the response topic.

The tests run the same deputy attacks against every service ``gateway.build_services`` builds
(``tests/broker/test_request_envelope.py``), so a service added there is covered without being named.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from appliance.broker.api import (
    IMPLEMENTATION_SPECIFIC_ERROR,
    NOT_AUTHORIZED,
    TOPIC_NAME_INVALID,
    BrokerHandle,
    InboundPublish,
    PublishVerdict,
)

log = logging.getLogger(__name__)

#: A request the service took: the broker does not route it to ordinary subscribers.
CONSUMED = PublishVerdict(route=False)
STATUS_VERSION_NOT_SUPPORTED = "505"


@dataclass(frozen=True, slots=True)
class EnvelopeRules:
    """What one service requires of its requests' envelopes."""

    #: Names the service in reason strings and the log ("the state store").
    service: str
    #: Names its requests ("state store requests").
    requests: str
    request_topic: str
    #: Topic prefixes the service publishes on itself; a response topic there would forge its messages.
    reserved_prefixes: tuple[str, ...] = ()
    #: The RPC convention's ``__protVer`` (e.g. "1.0"): checked on requests, sent on replies. None: the
    #: service's clients do not use it (the thermostats: a user property costs their heap).
    protocol_version: str | None = None
    #: ``__supProtMajVer`` (e.g. "1"), the major versions served when ``protocol_version`` is set.
    supported_majors: str = "1"
    #: Whether a request's ``__protVer`` (None when absent) is served; the rule the service's clients share.
    accepts_version: Callable[[str | None], bool] | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """A request whose envelope passed: who asked, and where the reply goes."""

    client_id: str
    username: str | None
    response_topic: str
    correlation_data: bytes


def refused(reason: str, code: int = IMPLEMENTATION_SPECIFIC_ERROR) -> PublishVerdict:
    """A PUBACK failure for a request that gets no reply (the connection stays)."""
    return PublishVerdict(reason_code=code, reason_string=reason, route=False)


def forbidden_response_topic(rules: EnvelopeRules, topic: str) -> bool:
    """A response topic no request may name, whoever asks (see the module docstring, step 1)."""
    return (topic == rules.request_topic or topic.startswith("$")
            or any(topic.startswith(prefix) for prefix in rules.reserved_prefixes)
            or "+" in topic or "#" in topic or "\x00" in topic)


def open_request(rules: EnvelopeRules, broker: BrokerHandle, message: InboundPublish) -> Request | PublishVerdict:
    """The request to serve, or the verdict that ends it (a refusal, or CONSUMED after a 505 reply)."""
    topic = message.response_topic
    if topic is not None and (forbidden_response_topic(rules, topic) or broker.serves(topic)):
        return PublishVerdict(reason_code=TOPIC_NAME_INVALID, reason_string=f"invalid response topic for {rules.service}",
                              disconnect=TOPIC_NAME_INVALID, route=False)
    if topic is not None and not broker.may_publish(message.client_id, message.username, topic):
        log.info("%s: client %r may not publish to its response topic %r; disconnected",
                 rules.service, message.client_id, topic)
        return PublishVerdict(reason_code=NOT_AUTHORIZED,
                              reason_string="the response topic is not one this client may publish to",
                              disconnect=NOT_AUTHORIZED, route=False)
    if message.protocol_level != 5:
        return refused(f"{rules.service} requires MQTT 5")
    if message.qos != 1:
        return refused(f"{rules.requests} must be QoS 1")
    if not topic:
        return refused("missing response topic")
    if message.correlation_data is None:
        return refused("missing correlation data")
    request = Request(message.client_id, message.username, topic, message.correlation_data)
    if rules.accepts_version is not None:
        requested = next((value for name, value in message.user_properties if name == "__protVer"), None)
        if not rules.accepts_version(requested):
            respond(rules, broker, request, b"", [
                ("__stat", STATUS_VERSION_NOT_SUPPORTED),
                ("__stMsg", f"unsupported protocol version {requested!r}"),
                ("__supProtMajVer", rules.supported_majors),
                ("__requestProtVer", requested or ""),
            ])
            return CONSUMED
    return request


def respond(rules: EnvelopeRules, broker: BrokerHandle, request: Request, payload: bytes,
            user_properties: list[tuple[str, str]] | None = None) -> bool:
    """Publish the reply to ``request``; False (and nothing published) if the requester may no longer
    publish to its response topic."""
    if not broker.may_publish(request.client_id, request.username, request.response_topic):
        log.info("%s: client %r may no longer publish to %r; its reply is dropped",
                 rules.service, request.client_id, request.response_topic)
        return False
    properties = list(user_properties or ())
    if rules.protocol_version is not None:
        properties.append(("__protVer", rules.protocol_version))
    broker.publish(request.response_topic, payload, qos=1, correlation_data=request.correlation_data,
                   user_properties=properties or None)
    return True
