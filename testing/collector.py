"""The suite's one MQTT collector: a real paho-mqtt client that subscribes and keeps what arrives.

Rules:

* Everything that arrives is kept, in arrival order, with its arrival time (``time.monotonic``, the clock
  the tests measure latencies with), under one `threading.Condition` that every arrival notifies. A test
  waits on that condition (`wait_for`, `wait_until`, `wait_for_topic`, `next`), never on a sleep.
* The subscriptions are made again on every (re)connect, so a collector survives the broker restarting
  behind it (paho reconnects on its own once connected).
* The constructor returns once the broker has acknowledged every subscription: a message published after
  it is seen. It fails with `CollectorError` (and closes the client) when the broker does not answer.
* Topics in ``aside`` (a gateway's own documents published on a timer whatever the test does, such as its
  metrics) are kept apart in ``set_aside``, so ``messages`` holds what the test caused.

`next` reads the messages in order, each once, as a queue would (a cursor over ``messages``); the other
waits look at everything kept. Subclasses that need another view of a PUBLISH (a batch unpacked into its
records, say) override `parse`, which turns one PUBLISH into the items kept (none to drop it).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from testing import paho_clients
from testing.waiting import WaitTimeout

#: How long a broker may take to answer the CONNECT and the SUBSCRIBEs before the collector gives up.
SUBSCRIBE_TIMEOUT_S = 10.0


class CollectorError(TimeoutError):
    """The broker did not acknowledge the collector's subscriptions in time."""


@dataclass(frozen=True)
class Received:
    """One PUBLISH as it arrived: its topic, payload, MQTT 5 user properties and arrival time."""

    topic: str
    payload: bytes
    user_properties: dict[str, str]
    at: float
    qos: int = 0
    retain: bool = False
    message: mqtt.MQTTMessage | None = None

    @property
    def n(self) -> int:
        """The ``n`` user property the forwarding tests number their messages with."""
        return int(self.user_properties["n"])

    @property
    def properties(self) -> Properties | None:
        """paho's MQTT 5 properties of the PUBLISH (content type, correlation data...)."""
        return self.message.properties if self.message is not None else None

    def json(self) -> Any:
        return json.loads(self.payload)


Item = TypeVar("Item")


class Collector(Generic[Item]):
    """A subscriber that keeps what arrives (see the module's rules).

    ``topics`` are filters (subscribed at ``qos``); more can be added with `subscribe`. ``protocol``,
    ``username``/``password``, ``keepalive`` and ``client_id`` go to paho as they are. ``reconnect_delay``
    is paho's (min, max) retry delay once the broker goes away.

    A durable session: ``clean_start=False`` with a ``session_expiry`` (seconds, MQTT 5) resumes the
    session the broker kept for ``client_id``; ``session_present`` is what the CONNACK said. Closing and
    building a new collector with the same arguments is the subscriber that went away and came back.
    """

    def __init__(
        self,
        host: str,
        port: int,
        topics: str | Iterable[str] = (),
        *,
        qos: int = 1,
        protocol: int = mqtt.MQTTv5,
        client_id: str | None = None,
        name: str = "collector",
        aside: Iterable[str] = (),
        username: str | None = None,
        password: str | None = None,
        keepalive: int = 60,
        reconnect_delay: tuple[float, float] | None = None,
        clean_start: bool = True,
        session_expiry: int | None = None,
    ) -> None:
        self.messages: list[Item] = []
        self.set_aside: list[Item] = []
        self.cond = threading.Condition()
        self._aside = frozenset(aside)
        self._read = 0
        self._filters: list[tuple[str, int]] = [(topic, qos) for topic in ([topics] if isinstance(topics, str) else topics)]
        self._subscriptions: dict[int, str] = {}  # SUBSCRIBE packet id -> filter, of this connection
        self._acked: set[int] = set()
        self._connected = False
        self.session_present: bool | None = None
        self.name = name
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or f"{name}-{uuid.uuid4().hex[:8]}", protocol=protocol,
            **({} if protocol == mqtt.MQTTv5 else {"clean_session": clean_start}),
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        if reconnect_delay is not None:
            self.client.reconnect_delay_set(*reconnect_delay)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        connect_properties = None
        if session_expiry is not None:
            connect_properties = Properties(PacketTypes.CONNECT)
            connect_properties.SessionExpiryInterval = session_expiry
        v5_only: dict[str, Any] = {"clean_start": clean_start, "properties": connect_properties} if protocol == mqtt.MQTTv5 else {}
        try:
            self.client.connect(host, port, keepalive=keepalive, **v5_only)
        except OSError:
            raise CollectorError(f"{name}: cannot connect to {host}:{port}") from None
        self.client.loop_start()
        try:
            self._wait(lambda: self._connected and self._pending_subscriptions() == 0, SUBSCRIBE_TIMEOUT_S,
                       lambda: f"{name}: no CONNACK/SUBACK for {[t for t, _ in self._filters]} from {host}:{port}")
        except WaitTimeout as timeout:
            self.close()
            raise CollectorError(str(timeout)) from None

    # -- paho's threads ------------------------------------------------------------------------------------

    def _on_connect(self, client: mqtt.Client, userdata: object, flags: Any, reason: Any, properties: object) -> None:
        with self.cond:
            self.session_present = bool(flags.session_present)
            self._acked.clear()
            self._subscriptions = {}
            for topic, qos in self._filters:
                _, mid = client.subscribe(topic, qos)
                if mid is not None:
                    self._subscriptions[mid] = topic
            self._connected = not getattr(reason, "is_failure", False)
            self.cond.notify_all()

    def _on_subscribe(self, client: mqtt.Client, userdata: object, mid: int, codes: object, properties: object) -> None:
        with self.cond:
            self._acked.add(mid)
            self.cond.notify_all()

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        items = self.parse(message, time.monotonic())
        if not items:
            return
        with self.cond:
            (self.set_aside if message.topic in self._aside else self.messages).extend(items)
            self.cond.notify_all()
        for item in items:
            self.record(item)

    def _pending_subscriptions(self) -> int:
        return len(set(self._subscriptions) - self._acked)

    # -- what a subclass may change -------------------------------------------------------------------------

    def parse(self, message: mqtt.MQTTMessage, at: float) -> Sequence[Item]:
        """The items kept for one PUBLISH: by default one `Received`."""
        user_properties = dict(getattr(message.properties, "UserProperty", None) or [])
        received = Received(message.topic, bytes(message.payload), user_properties, at, message.qos, bool(message.retain), message)
        return [received]  # type: ignore[list-item]  # `Item` is `Received` unless a subclass parses

    def record(self, item: Item) -> None:
        """Called on paho's thread for every item kept, after it is visible in ``messages``."""

    # -- the test's side -----------------------------------------------------------------------------------

    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str | Callable[[], str]) -> None:
        with self.cond:
            if not self.cond.wait_for(predicate, timeout):
                raise WaitTimeout(f"{what() if callable(what) else what} not met within {timeout:g} s")

    def subscribe(self, topic: str, qos: int = 1, timeout: float = SUBSCRIBE_TIMEOUT_S) -> None:
        """Subscribe to one more filter (kept for reconnects) and return once the broker acknowledged it."""
        with self.cond:
            self._filters.append((topic, qos))
            _, mid = self.client.subscribe(topic, qos)
            if mid is None:
                raise CollectorError(f"{self.name}: not connected, cannot subscribe to {topic}")
            self._subscriptions[mid] = topic
        self._wait(lambda: mid in self._acked, timeout, f"{self.name}: SUBACK for {topic}")

    def wait_for(self, awaited: int | Callable[[list[Item]], bool], timeout: float = 15.0,
                 what: str | Callable[[], str] | None = None) -> list[Item]:
        """Every item kept, once there are ``awaited`` of them or ``awaited(messages)`` holds (re-checked on
        every arrival)."""
        if isinstance(awaited, int):
            count = awaited
            predicate: Callable[[list[Item]], bool] = lambda kept: len(kept) >= count  # noqa: E731
            what = what or (lambda: f"{self.name}: {len(self.messages)} of {count} messages")
        else:
            predicate = awaited
        self._wait(lambda: predicate(self.messages), timeout, what or f"{self.name}: the awaited messages")
        return self.snapshot()

    def wait_until(self, condition: Callable[[], bool], timeout: float = 15.0,
                   what: str | Callable[[], str] = "condition") -> None:
        """Until ``condition()`` holds, re-checked on every arrival (for conditions over derived views)."""
        self._wait(condition, timeout, what)

    def wait_for_topic(self, topic: str, timeout: float = 15.0) -> Item:
        """The first item kept on ``topic`` (among the set-aside ones for an ``aside`` topic)."""
        kept = self.set_aside if topic in self._aside else self.messages

        def first() -> Item | None:
            return next((item for item in kept if getattr(item, "topic", None) == topic), None)

        self._wait(lambda: first() is not None, timeout, lambda: f"{self.name}: a message on {topic} among {len(kept)}")
        found = first()
        assert found is not None
        return found

    def next(self, timeout: float = 5.0, where: Callable[[Item], bool] = lambda item: True) -> Item:
        """The next item not read by `next` before that satisfies ``where``; the ones skipped count as read."""
        found: list[Item] = []

        def advance() -> bool:
            while self._read < len(self.messages):
                item = self.messages[self._read]
                self._read += 1
                if where(item):
                    found.append(item)
                    return True
            return False

        self._wait(advance, timeout, f"{self.name}: a next message ({self._read} read)")
        return found[0]

    def next_json(self, topic_suffix: str = "", timeout: float = 5.0) -> Any:
        """The payload, decoded, of the next message (as `next` reads) whose topic ends with ``topic_suffix``."""
        item = self.next(timeout, lambda item: str(getattr(item, "topic", "")).endswith(topic_suffix))
        return json.loads(getattr(item, "payload", b""))

    def read_all(self) -> list[Item]:
        """The items `next` has not read yet, which now count as read."""
        with self.cond:
            unread = self.messages[self._read :]
            self._read = len(self.messages)
            return unread

    def snapshot(self) -> list[Item]:
        with self.cond:
            return list(self.messages)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False,
                user_properties: Iterable[tuple[str, str]] = (), timeout: float = 5.0, **properties: Any) -> None:
        """Publish from the same client (MQTT 5 ``properties`` by paho's names) and wait until it is sent
        (for QoS 1, acknowledged)."""
        props = None
        if self.client.protocol == mqtt.MQTTv5:
            props = Properties(PacketTypes.PUBLISH)
            for key, value in properties.items():
                setattr(props, key, value)
            if user_properties:
                props.UserProperty = list(user_properties)
        self.client.publish(topic, payload, qos=qos, retain=retain, properties=props).wait_for_publish(timeout)

    def close(self) -> None:
        paho_clients.close(self.client)

    def __enter__(self) -> Collector[Item]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
