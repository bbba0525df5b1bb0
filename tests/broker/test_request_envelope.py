"""No in-process service is a confused deputy: the same attacks against every service the gateway builds.

The services are not named here: they come from ``gateway.build_services`` (the one place a service is
added) and from every ``BrokerService`` class in the ``appliance`` package. Each needs an entry in
``REQUESTS`` (a request it serves, to attack it with); a new service without one fails
``test_every_service_is_attacked`` - so it cannot be added without facing these tests. The broker is a
recording ``BrokerHandle`` over the real ``Acl``; each publish is checked against the ACL *when it is
made*, so a reply queued before a SIGHUP took the right away counts too.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import appliance
from appliance.broker.api import BrokerService, InboundPublish
from appliance.broker.config import DEFAULT_ACL_CLIENT_PATTERNS
from appliance.broker.routing.topic_tree import topic_matches
from appliance.broker.security.acl import Acl, AclFileError
from appliance.gateway import build_services
from appliance.gateway_config import load_config
from appliance.hardware.service import HardwareService
from appliance.statestore.commands import GetCommand, KeyNotifyCommand
from appliance.statestore.resp3 import encode_array
from testing.campaigns import campaign

ROUTES = '{"schemaVersion": "1.1.0", "routes": {"all": {"route": "FROM /messages/* INTO $upstream", "priority": 9}}}'

#: Per service class: (request topic, payloads it serves). A service with no topic filters gets none.
REQUESTS: dict[str, tuple[str, tuple[bytes, ...]]] = {
    "StateStoreService": ("statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke",
                          (GetCommand(b"k").encode(), KeyNotifyCommand(b"k").encode())),
    # A request for a version that does not exist: its answer echoes the requester's text.
    "FirmwareService": ("firmware/v1/command/chunk",
                        (encode_array([b"CHUNK", b"text-of-her-choice", b"app.mpy", b"0", b"64"]),
                         encode_array([b"CHUNK"]))),
    # Telemetry: routed upstream, never answered locally.
    "ForwardingService": ("devices/mallory/messages/events", (b'{"t": 1}',)),
}

#: mallory may read c/# and use the services' request topics, but write only her own topics.
ACL = """\
pattern write statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke
pattern write firmware/v1/command/chunk
pattern write devices/%c/#

user mallory
topic read c/#
topic readwrite mallory/#
"""


@dataclass
class AclBroker:
    """A BrokerHandle over a real ACL that records each publish with whether the requester could have
    made it herself at that moment. The services' own status documents under ``$SYS/gateway/`` (forwarding
    publishes its metrics at start and on a timer, whatever anyone asks) are no answer to a request and
    are not recorded; a request naming a ``$`` topic as its response topic is refused on its own (below)."""

    acl: Acl | None
    requester: tuple[str, str | None] = ("mallory", "mallory")
    published: list[tuple[str, bool]] = field(default_factory=list)
    disconnected: list[int] = field(default_factory=list)
    #: The topic filters of the services started on it, as ``Broker.service_filters``.
    service_filters: list[str] = field(default_factory=list)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, **props: Any) -> None:
        if topic.startswith("$SYS/gateway/"):
            return
        self.published.append((topic, self.may_publish(*self.requester, topic)))

    def disconnect(self, client_id: str, reason_code: int, reason_string: str | None = None) -> None:
        self.disconnected.append(reason_code)

    def may_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return self.acl is None or self.acl.can_publish(client_id, username, topic)

    def serves(self, topic: str) -> bool:
        return any(topic_matches(topic_filter, topic) for topic_filter in self.service_filters)

    def deputy_writes(self) -> list[str]:
        return [topic for topic, allowed in self.published if not allowed]


def every_service_class() -> set[str]:
    """Every class in the ``appliance`` package that takes publishes from the broker (has ``topic_filters``
    and ``on_publish``): a service, whether ``build_services`` starts it in a given config or not."""
    found = set()
    for module in pkgutil.walk_packages(appliance.__path__, "appliance."):
        if module.name.endswith("__main__"):
            continue
        for name, value in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if value.__module__ == module.name and hasattr(value, "topic_filters") and hasattr(value, "on_publish"):
                found.add(name)
    return found


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[list[BrokerService], AclBroker, asyncio.AbstractEventLoop]]:
    """The gateway's own service list, every section that serves requests enabled, started on one loop."""
    manifest = tmp_path / "routes.json"
    manifest.write_text(ROUTES)
    config = load_config(None, {"gateway": {"data_dir": str(tmp_path / "data")},
                                "forwarding": {"enabled": True, "manifest": str(manifest)}})
    loop = asyncio.new_event_loop()
    broker = AclBroker(Acl.parse(ACL, "acl", DEFAULT_ACL_CLIENT_PATTERNS))
    built = build_services(config)
    broker.service_filters = [topic_filter for service in built for topic_filter in service.topic_filters]
    for service in built:
        loop.run_until_complete(service.start(broker))
    yield built, broker, loop
    for service in reversed(built):
        loop.run_until_complete(service.stop())
    loop.close()


def request(service: BrokerService, payload: bytes, response_topic: str | None, *, client_id: str = "mallory",
            username: str | None = "mallory", level: int = 5, qos: int = 1) -> InboundPublish:
    topic, _ = REQUESTS[type(service).__name__]
    return InboundPublish(client_id=client_id, username=username, protocol_level=level, topic=topic, payload=payload,
                          qos=qos, retain=False, response_topic=response_topic, correlation_data=b"corr")


def settle(loop: asyncio.AbstractEventLoop) -> None:
    """Let queued work (the firmware service's worker) run to completion."""
    async def turns() -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    loop.run_until_complete(turns())


def attack(loop: asyncio.AbstractEventLoop, service: BrokerService, message: InboundPublish) -> Any:
    verdict = loop.run_until_complete(service.on_publish(message))
    settle(loop)
    return verdict


def test_every_service_is_attacked(services: tuple[list[BrokerService], AclBroker, Any]) -> None:
    built, _, _ = services
    in_gateway = {type(service).__name__ for service in built}
    missing = (every_service_class() | in_gateway) - set(REQUESTS) - {HardwareService.__name__}
    assert not missing, f"add a request each of {sorted(missing)} serves to REQUESTS: its deputy tests run from there"
    assert HardwareService.topic_filters == (), "the hardware service takes publishes now: give it a REQUESTS entry"
    assert set(REQUESTS) <= in_gateway


def answering(built: list[BrokerService]) -> Iterator[tuple[BrokerService, bytes]]:
    for service in built:
        if service.topic_filters:
            for payload in REQUESTS[type(service).__name__][1]:
                yield service, payload


@pytest.mark.parametrize("response_topic", [
    "c/deputy",  # a topic mallory may read but not write: the deputy of issue 25
    "victim/inbox",  # nobody's rule
    "clients/victim/resp",  # another client's SDK response topic
])
def test_no_service_replies_where_the_requester_may_not_publish(
    services: tuple[list[BrokerService], AclBroker, asyncio.AbstractEventLoop], response_topic: str,
) -> None:
    built, broker, loop = services
    for service, payload in answering(built):
        broker.disconnected.clear()
        verdict = attack(loop, service, request(service, payload, response_topic))
        assert not broker.deputy_writes(), (type(service).__name__, broker.published)
        if service.topic_filters != ("devices/#",):  # a request/response service refuses and disconnects
            assert (verdict.reason_code, verdict.disconnect, verdict.route) == (0x87, 0x87, False), type(service)


@pytest.mark.parametrize("response_topic", ["c/#", "c/+", "$SYS/broker/uptime", "mallory/\x00x"])
def test_no_service_replies_on_a_topic_that_is_no_topic_name_or_the_brokers(
    services: tuple[list[BrokerService], AclBroker, asyncio.AbstractEventLoop], response_topic: str,
) -> None:
    built, broker, loop = services
    broker.acl = None  # even where everything is allowed
    for service, payload in answering(built):
        attack(loop, service, request(service, payload, response_topic))
        assert all(topic != response_topic for topic, _ in broker.published), type(service).__name__


def test_no_service_replies_on_its_own_request_topic(
    services: tuple[list[BrokerService], AclBroker, asyncio.AbstractEventLoop],
) -> None:
    built, broker, loop = services
    broker.acl = None
    for service, payload in answering(built):
        own = REQUESTS[type(service).__name__][0]
        verdict = attack(loop, service, request(service, payload, own))
        assert all(topic != own for topic, _ in broker.published), type(service).__name__
        if service.topic_filters != ("devices/#",):
            assert verdict.disconnect == 0x90


def test_no_service_replies_on_another_services_request_topic(
    services: tuple[list[BrokerService], AclBroker, asyncio.AbstractEventLoop],
) -> None:
    """A reply published there skips that service and reaches its topic's subscribers as a request nobody
    made (the firmware service's -ERR echoing the requester's text on the state store's request topic),
    though the requester may write the topic: her own publish there would have gone to the service."""
    built, broker, loop = services
    for service, payload in answering(built):
        for other, (topic, _) in REQUESTS.items():
            if other == type(service).__name__:
                continue
            broker.published.clear()
            verdict = attack(loop, service, request(service, payload, topic))
            assert all(published != topic for published, _ in broker.published), (type(service).__name__, other)
            if service.topic_filters != ("devices/#",):
                assert (verdict.reason_code, verdict.disconnect) == (0x90, 0x90), (type(service).__name__, other)


def test_a_reply_queued_before_the_acl_changed_is_not_sent(
    services: tuple[list[BrokerService], AclBroker, asyncio.AbstractEventLoop],
) -> None:
    """Requests are accepted under one ACL; a SIGHUP takes mallory's own topics away before the service
    answers (the firmware service answers after everything else the loop has ready)."""
    built, broker, loop = services
    for service, payload in answering(built):
        loop.run_until_complete(service.on_publish(request(service, payload, "mallory/replies")))
        broker.acl = Acl.parse(ACL.replace("topic readwrite mallory/#", "topic read mallory/#"), "acl",
                               DEFAULT_ACL_CLIENT_PATTERNS)
        settle(loop)
        assert not broker.deputy_writes(), (type(service).__name__, broker.published)
        broker.acl = Acl.parse(ACL, "acl", DEFAULT_ACL_CLIENT_PATTERNS)


def test_a_valid_request_is_still_answered(services: tuple[list[BrokerService], AclBroker, Any]) -> None:
    built, broker, loop = services
    for service, payload in answering(built):
        if service.topic_filters == ("devices/#",):
            continue
        before = len(broker.published)
        verdict = attack(loop, service, request(service, payload, "mallory/replies"))
        assert verdict.reason_code == 0 and verdict.disconnect is None
        assert broker.published[before:] == [("mallory/replies", True)], type(service).__name__


_levels = st.sampled_from(["c", "d", "clients", "mallory", "firmware", "statestore", "%c", "%u", "+", "#"])
_filters = st.lists(_levels, min_size=1, max_size=4).map("/".join).filter(lambda f: "#" not in f[:-1])
_rules = st.lists(st.tuples(st.sampled_from(["topic", "pattern"]), st.sampled_from(["read", "write", "readwrite", "deny"]),
                            _filters), max_size=5)
_topics = st.lists(st.sampled_from(["c", "d", "clients", "mallory", "firmware", "v1", "x", "+", "#", "", "$SYS"]),
                   min_size=1, max_size=4).map("/".join)


@given(rules=_rules, response_topic=_topics, username=st.sampled_from([None, "mallory"]),
       level=st.sampled_from([4, 5]), qos=st.sampled_from([0, 1, 2]), protocol_version=st.sampled_from([None, "1.0", "2.0"]))
@campaign(100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_whatever_the_acl_and_envelope_no_service_writes_where_the_requester_may_not(
    services: tuple[list[BrokerService], AclBroker, asyncio.AbstractEventLoop], rules: list[tuple[str, str, str]],
    response_topic: str, username: str | None, level: int, qos: int, protocol_version: str | None,
) -> None:
    built, broker, loop = services
    text = ACL + "".join(f"{kind} {access} {topic_filter}\n" for kind, access, topic_filter in rules)
    try:
        broker.acl = Acl.parse(text, "acl", DEFAULT_ACL_CLIENT_PATTERNS)
    except AclFileError:
        return  # a rule the file format refuses (the gateway would not start with it)
    broker.requester = ("mallory", username)
    broker.published.clear()
    for service, payload in answering(built):
        message = request(service, payload, response_topic, username=username, level=level, qos=qos)
        if protocol_version is not None:
            message.user_properties.append(("__protVer", protocol_version))
        attack(loop, service, message)
        assert not broker.deputy_writes(), (text, type(service).__name__, broker.published)
