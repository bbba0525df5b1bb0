"""The service on its own: envelope checks, responses and their properties, notifications, expiry sweep.

The broker is a small recording ``BrokerHandle``; the gateway tests run the same paths over real MQTT.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.broker.api import InboundPublish
from appliance.broker.config import DEFAULT_ACL_CLIENT_PATTERNS
from appliance.broker.security.acl import Acl, AclFileError
from appliance.runtime import wall_ms
from appliance.statestore import errors
from appliance.statestore.acl import AclRule
from appliance.statestore.commands import (
    Condition,
    DelCommand,
    GetCommand,
    KeyNotifyCommand,
    SetCommand,
    VDelCommand,
)
from appliance.statestore.config import StateStoreConfig
from appliance.statestore.hlc import Hlc
from appliance.statestore.notify import notification_topic
from appliance.statestore.protocol import REQUEST_TOPIC
from appliance.statestore.resp3 import encode_array
from appliance.statestore.service import StateStoreService
from testing import waiting
from testing.campaigns import campaign
from testing.fake_runtime import WALL_CLOCK_START, FakeRuntime

T0 = int(WALL_CLOCK_START * 1000)  # the fake runtime's wall clock at its start, in ms
T = TypeVar("T")


@dataclass
class Published:
    topic: str
    payload: bytes
    qos: int
    correlation_data: bytes | None
    user_properties: dict[str, str]


@dataclass
class RecordingBroker:
    published: list[Published] = field(default_factory=list)
    disconnected: list[tuple[str, int]] = field(default_factory=list)
    acl: Acl | None = None  # the broker's real ACL; None: no acl_file, everything allowed

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, **props: Any) -> None:
        self.published.append(
            Published(topic, payload, qos, props.get("correlation_data"), dict(props.get("user_properties") or []))
        )

    def disconnect(self, client_id: str, reason_code: int, reason_string: str | None = None) -> None:
        self.disconnected.append((client_id, reason_code))

    def may_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return self.acl is None or self.acl.can_publish(client_id, username, topic)

    def serves(self, topic: str) -> bool:
        return topic == REQUEST_TOPIC

    def prometheus(self) -> str:
        return ""


class Harness:
    def __init__(self, service: StateStoreService, broker: RecordingBroker, runtime: FakeRuntime) -> None:
        self.service, self.broker, self.runtime = service, broker, runtime

    def request(
        self,
        payload: bytes,
        client_id: str = "c1",
        timestamp: str | None = "auto",
        fencing_token: str | None = None,
        username: str | None = None,
    ) -> Published:
        props = []
        if timestamp == "auto":
            timestamp = str(Hlc(wall_ms(self.runtime), 0, client_id))
        if timestamp is not None:
            props.append(("__ts", timestamp))
        if fencing_token is not None:
            props.append(("__ft", fencing_token))
        message = InboundPublish(
            client_id=client_id, username=username, protocol_level=5, topic=REQUEST_TOPIC, payload=payload, qos=1,
            retain=False, user_properties=props, response_topic=f"clients/{client_id}/resp", correlation_data=b"cd",
        )
        before = len(self.broker.published)
        verdict = asyncio.get_event_loop().run_until_complete(self.service.on_publish(message))
        assert verdict.reason_code == 0 and verdict.route is False
        response = self.broker.published[before]
        assert response.topic == f"clients/{client_id}/resp" and response.correlation_data == b"cd" and response.qos == 1
        assert response.user_properties["__stat"] == "200"
        return response


@pytest.fixture
def harness(tmp_path: Path) -> Any:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    runtime = FakeRuntime(loop=loop)  # its wall clock starts at T0
    broker = RecordingBroker()
    service = StateStoreService(StateStoreConfig(max_keys=3), tmp_path, runtime)
    loop.run_until_complete(service.start(broker))
    yield Harness(service, broker, runtime)
    loop.run_until_complete(service.stop())
    loop.close()
    asyncio.set_event_loop(None)


def test_set_get_del_responses_and_versions(harness: Harness) -> None:
    set_reply = harness.request(SetCommand(b"k", b"v").encode())
    assert set_reply.payload == b"+OK\r\n"
    version = set_reply.user_properties["__ts"]
    assert Hlc.parse(version) > Hlc(T0, 0, "c1")
    get_reply = harness.request(GetCommand(b"k").encode(), timestamp=None)
    assert (get_reply.payload, get_reply.user_properties["__ts"]) == (b"$1\r\nv\r\n", version)
    nx = harness.request(SetCommand(b"k", b"w", Condition.NX).encode())
    assert nx.payload == b":-1\r\n" and "__ts" in nx.user_properties  # both SET outcomes carry __ts
    vdel = harness.request(VDelCommand(b"k", b"w").encode(), timestamp=None)
    assert (vdel.payload, vdel.user_properties["__ts"]) == (b":-1\r\n", version)
    deleted = harness.request(DelCommand(b"k").encode(), timestamp=None)
    assert (deleted.payload, deleted.user_properties["__ts"]) == (b":1\r\n", version)
    miss = harness.request(GetCommand(b"k").encode(), timestamp=None)
    assert miss.payload == b"$-1\r\n" and "__ts" not in miss.user_properties
    assert harness.request(DelCommand(b"k").encode()).payload == b":0\r\n"


@pytest.mark.parametrize(
    ("timestamp", "fencing_token", "message"),
    [
        (None, None, errors.MISSING_TIMESTAMP),
        ("yesterday", None, errors.MALFORMED_TIMESTAMP),
        ("auto", "1:x:y", errors.MALFORMED_TIMESTAMP),
        (str(Hlc(T0 + 60_001, 0, "c")), None, errors.TIMESTAMP_SKEW),
        ("auto", str(Hlc(T0 + 60_001, 0, "c")), errors.FENCING_TOKEN_SKEW),
    ],
)
def test_timestamp_errors(harness: Harness, timestamp: str | None, fencing_token: str | None, message: str) -> None:
    reply = harness.request(SetCommand(b"k", b"v").encode(), timestamp=timestamp, fencing_token=fencing_token)
    assert reply.payload == f"-ERR {message}\r\n".encode()
    assert "__ts" not in reply.user_properties
    assert harness.request(GetCommand(b"k").encode()).payload == b"$-1\r\n"  # nothing was stored


def test_exactly_one_minute_ahead_is_accepted(harness: Harness) -> None:
    reply = harness.request(SetCommand(b"k", b"v").encode(), timestamp=str(Hlc(T0 + 60_000, 0, "c")))
    assert reply.payload == b"+OK\r\n"
    assert Hlc.parse(reply.user_properties["__ts"]) > Hlc(T0 + 60_000, 0, "c")


def test_quota_through_the_service(harness: Harness) -> None:
    for key in (b"a", b"b", b"c"):
        assert harness.request(SetCommand(key, b"v").encode()).payload == b"+OK\r\n"
    assert harness.request(SetCommand(b"d", b"v").encode()).payload == b"-ERR the quota has been exceeded\r\n"


def test_payload_errors_are_answered(harness: Harness) -> None:
    assert harness.request(b"garbage").payload == b"-ERR syntax error\r\n"
    assert harness.request(encode_array([b"PING"])).payload == b"-ERR unknown command\r\n"


def run(harness: Harness, coroutine: Awaitable[T]) -> T:
    return asyncio.get_event_loop().run_until_complete(coroutine)


def envelope(**overrides: Any) -> InboundPublish:
    fields: dict[str, Any] = dict(
        client_id="c1", username=None, protocol_level=5, topic=REQUEST_TOPIC, payload=GetCommand(b"k").encode(), qos=1,
        retain=False, response_topic="clients/c1/resp", correlation_data=b"1",
    )
    fields.update(overrides)
    return InboundPublish(**fields)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"protocol_level": 4}, "the state store requires MQTT 5"),
        ({"qos": 0}, "state store requests must be QoS 1"),
        ({"qos": 2}, "state store requests must be QoS 1"),
        ({"response_topic": None}, "missing response topic"),
        ({"correlation_data": None}, "missing correlation data"),
    ],
)
def test_bad_envelopes_fail_in_the_puback_and_get_no_response(harness: Harness, overrides: dict[str, Any], reason: str) -> None:
    verdict = run(harness, harness.service.on_publish(envelope(**overrides)))
    assert verdict.reason_code >= 0x80 and verdict.reason_string == reason and verdict.disconnect is None
    assert harness.broker.published == []


@pytest.mark.parametrize(
    "topic",
    [
        REQUEST_TOPIC,
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8",
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/x/command/notify/y",
        "clients/c1/+",
        "clients/#",
        "#",
    ],
)
def test_a_forbidden_response_topic_disconnects(harness: Harness, topic: str) -> None:
    verdict = run(harness, harness.service.on_publish(envelope(response_topic=topic)))
    assert verdict.disconnect is not None and verdict.disconnect >= 0x80
    assert harness.broker.published == []


def test_a_similar_but_allowed_response_topic_is_answered(harness: Harness) -> None:
    verdict = run(harness, harness.service.on_publish(envelope(response_topic="clients/statestore/v1/other")))
    assert verdict.disconnect is None and verdict.reason_code == 0
    assert harness.broker.published[0].payload == b"$-1\r\n"


def test_keynotify_registrations_of_one_client_are_bounded_in_count_and_bytes(harness: Harness) -> None:
    """Registrations are memory held while the client is connected: before, one client registering
    distinct keys grew it without end (2,000 x 1 KB keys: 2 MB). Past 1,024 registrations or 64 KiB of
    keys a new one is refused with the quota error; the client's others stay, STOP makes room."""
    quota = b"-ERR the quota has been exceeded\r\n"
    answers = [harness.request(KeyNotifyCommand(b"%05d" % n + b"k" * 1_000).encode(), client_id="w").payload
               for n in range(2_000)]
    assert answers[:65] == [b"+OK\r\n"] * 65 and set(answers[65:]) == {quota}
    registry = harness.service.registry
    assert sum(map(len, registry._by_client["w"])) <= 64 * 1024
    assert harness.request(KeyNotifyCommand(b"00000" + b"k" * 1_000).encode(), client_id="w").payload == b"+OK\r\n"
    stop = KeyNotifyCommand(b"00000" + b"k" * 1_000, stop=True).encode()
    assert harness.request(stop, client_id="w").payload == b"+OK\r\n"
    assert harness.request(KeyNotifyCommand(b"x" * 900).encode(), client_id="w").payload == b"+OK\r\n"
    answers = [harness.request(KeyNotifyCommand(b"%d" % n).encode(), client_id="short").payload for n in range(1_100)]
    assert answers.count(b"+OK\r\n") == 1_024 and answers[-1] == quota
    harness.service.on_client_disconnected("short")
    assert harness.request(KeyNotifyCommand(b"1").encode(), client_id="short").payload == b"+OK\r\n"


def test_keynotify_lifecycle_and_notification_format(harness: Harness) -> None:
    assert harness.request(KeyNotifyCommand(b"k").encode(), client_id="watcher").payload == b"+OK\r\n"
    assert harness.request(KeyNotifyCommand(b"k").encode(), client_id="watcher").payload == b"+OK\r\n"  # idempotent
    reply = harness.request(SetCommand(b"k", b"abc").encode())
    notes = harness.broker.published[-1:]
    assert [(n.topic, n.payload, n.user_properties) for n in notes] == [
        (notification_topic("watcher", b"k"), b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n",
         {"__ts": reply.user_properties["__ts"], "__protVer": "1.0"})
    ]
    harness.request(DelCommand(b"k").encode())
    assert harness.broker.published[-1].payload == b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
    assert harness.request(KeyNotifyCommand(b"k", stop=True).encode(), client_id="watcher").payload == b"+OK\r\n"
    assert harness.request(KeyNotifyCommand(b"k", stop=True).encode(), client_id="watcher").payload == b":0\r\n"
    count = len(harness.broker.published)
    harness.request(SetCommand(b"k", b"again").encode())
    assert len(harness.broker.published) == count + 1  # the response only


def test_disconnect_drops_registrations(harness: Harness) -> None:
    harness.request(KeyNotifyCommand(b"k").encode(), client_id="watcher")
    harness.service.on_client_disconnected("watcher")
    count = len(harness.broker.published)
    harness.request(SetCommand(b"k", b"v").encode())
    assert len(harness.broker.published) == count + 1


def test_the_sweep_notifies_delete_at_the_deadline(harness: Harness) -> None:
    """Expiry on the fake clock: nothing 1 ms before the deadline, the DELETE notification at it."""
    harness.request(KeyNotifyCommand(b"k").encode(), client_id="watcher")
    harness.request(SetCommand(b"k", b"v", expire_ms=50).encode())
    deadline = harness.runtime.time + 0.05

    def deletes() -> list[Published]:
        return [item for item in harness.broker.published if item.payload.endswith(b"DELETE\r\n")]

    # The SET woke the sweep, which asks the store (a real thread) when the next entry expires and then
    # sleeps until then. Wait for that sleep before moving the clock: moved first, the store read the
    # moved clock, and the sweep slept from there past a clock that moves no more (1 run in 5).
    run(harness, waiting.until(lambda: deadline in harness.runtime.deadlines(), what="the sweep asleep until the deadline"))
    run(harness, harness.runtime.elapse(0.049))
    assert deletes() == []
    run(harness, harness.runtime.elapse(0.001))
    run(harness, waiting.until(lambda: bool(deletes()), what="the DELETE notification"))  # a store thread trip
    assert [note.topic for note in deletes()] == [notification_topic("watcher", b"k")]


def test_acl(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    rules = (AclRule("alice", "alice/", ("read", "write")), AclRule("*", "public/", ("read",)))
    runtime = FakeRuntime(loop=loop)
    service = StateStoreService(StateStoreConfig(acl=rules), tmp_path, runtime)
    loop.run_until_complete(service.start(RecordingBroker()))
    harness = Harness(service, service._broker, runtime)  # type: ignore[arg-type]
    try:
        denied = b"-ERR not authorized\r\n"
        assert harness.request(SetCommand(b"alice/x", b"v").encode(), username="alice").payload == b"+OK\r\n"
        assert harness.request(SetCommand(b"alice/x", b"v").encode(), username="bob").payload == denied
        assert harness.request(GetCommand(b"alice/x").encode(), username="bob").payload == denied
        assert harness.request(KeyNotifyCommand(b"alice/x").encode(), username=None).payload == denied
        assert harness.request(GetCommand(b"public/x").encode(), username=None).payload == b"$-1\r\n"
        assert harness.request(SetCommand(b"public/x", b"v").encode(), username="bob").payload == denied
        assert harness.request(DelCommand(b"public/x").encode(), username="alice").payload == denied
    finally:
        loop.run_until_complete(service.stop())
        loop.close()
        asyncio.set_event_loop(None)


# -- never a confused deputy: responses and notifications only where the requester may publish --------

DEPUTY_ACL = """\
user mallory
topic read c/#
topic readwrite mallory/#
"""


def secured(harness: Harness, text: str = DEPUTY_ACL, patterns: tuple[str, ...] = DEFAULT_ACL_CLIENT_PATTERNS) -> None:
    """The broker's ACL, as an acl_file with the configured client patterns gives it."""
    harness.broker.acl = Acl.parse(text, "acl", patterns)


def test_a_response_topic_the_requester_may_not_write_is_refused_and_nothing_is_published(harness: Harness) -> None:
    secured(harness)
    harness.request(SetCommand(b"k", b"chosen by mallory").encode())  # a value the deputy would carry
    before = len(harness.broker.published)
    verdict = run(harness, harness.service.on_publish(envelope(username="mallory", response_topic="c/deputy")))
    assert (verdict.reason_code, verdict.disconnect, verdict.route) == (0x87, 0x87, False)
    assert len(harness.broker.published) == before
    # The same client's own topics (the default client patterns, or its ACL) are answered.
    for topic in ("clients/c1/services/statestore/_any_/command/invoke/response", "mallory/resp"):
        verdict = run(harness, harness.service.on_publish(envelope(username="mallory", response_topic=topic)))
        assert verdict.reason_code == 0 and harness.broker.published[-1].topic == topic


def test_keynotify_needs_a_notification_topic_the_client_may_write(harness: Harness) -> None:
    # An ACL file without the client patterns: responses on clients/<id>/resp, no notification topic.
    secured(harness, DEPUTY_ACL + "topic readwrite clients/+/resp\n", patterns=())
    assert harness.request(KeyNotifyCommand(b"k").encode(), client_id="watcher", username="mallory",
                           ).payload == b"-ERR not authorized\r\n"
    count = len(harness.broker.published)
    harness.request(SetCommand(b"k", b"v").encode(), client_id="mallory", username="mallory")
    assert len(harness.broker.published) == count + 1  # the response only: nothing was registered


def test_notifications_are_rechecked_when_sent_and_end_when_the_acl_no_longer_allows_them(harness: Harness) -> None:
    secured(harness)
    assert harness.request(KeyNotifyCommand(b"k").encode(), client_id="watcher", username="mallory").payload == b"+OK\r\n"
    harness.request(SetCommand(b"k", b"one").encode(), client_id="mallory", username="mallory")
    assert harness.broker.published[-1].topic == notification_topic("watcher", b"k")
    secured(harness, patterns=("readwrite clients/%c/#",))  # SIGHUP: notification topics no longer writable
    count = len(harness.broker.published)
    harness.request(SetCommand(b"k", b"two").encode(), client_id="mallory", username="mallory")
    assert len(harness.broker.published) == count + 1  # the response, no notification
    assert not harness.service.registry.is_registered("watcher", b"k")
    secured(harness)  # restoring the ACL does not resurrect the registration
    harness.request(SetCommand(b"k", b"three").encode(), client_id="mallory", username="mallory")
    assert len(harness.broker.published) == count + 2


_levels = st.sampled_from(["c", "d", "clients", "statestore", "c1", "6331", "mallory", "%c", "%u", "%x", "+", "#"])
_filters = st.lists(_levels, min_size=1, max_size=4).map("/".join).filter(lambda f: "#" not in f[:-1])
_rules = st.lists(st.tuples(st.sampled_from(["topic", "pattern"]), st.sampled_from(["read", "write", "readwrite", "deny"]),
                            _filters), max_size=5)
_topics = st.lists(st.sampled_from(["c", "d", "clients", "statestore", "c1", "6331", "mallory", "x", "+", "#", ""]),
                   min_size=1, max_size=4).map("/".join)


@given(rules=_rules, response_topic=_topics, username=st.sampled_from([None, "mallory", "c1"]))
@campaign(300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_acl_and_response_topic_gets_a_write_the_acl_denies(
    harness: Harness, rules: list[tuple[str, str, str]], response_topic: str, username: str | None
) -> None:
    """Whatever the ACL and the response topic, every message the service publishes for a request goes to a
    topic the requester may publish to; and a request whose topic it may publish to is answered."""
    text = "user writer\ntopic readwrite #\nuser mallory\n" + "".join(
        f"{kind} {access} {topic_filter}\n" for kind, access, topic_filter in rules
    )
    try:
        acl = Acl.parse(text, "acl", DEFAULT_ACL_CLIENT_PATTERNS)
    except AclFileError:
        return  # a rule the file format refuses (the gateway would not start with it)
    harness.broker.acl = acl
    harness.broker.published.clear()
    harness.broker.disconnected.clear()
    for payload in (GetCommand(b"k").encode(), KeyNotifyCommand(b"k").encode()):
        verdict = run(harness, harness.service.on_publish(
            envelope(username=username, response_topic=response_topic, payload=payload)))
        for message in harness.broker.published:
            assert acl.can_publish("c1", username, message.topic), (text, message.topic)
        if verdict.reason_code == 0 and verdict.disconnect is None:
            assert harness.broker.published and harness.broker.published[-1].topic == response_topic
    harness.request(SetCommand(b"k", b"v").encode(), client_id="writer", username="writer")  # notifies c1 if registered
    harness.service.on_client_disconnected("c1")
    for message in harness.broker.published:
        assert message.topic == "clients/writer/resp" or acl.can_publish("c1", username, message.topic)
