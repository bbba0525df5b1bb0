"""Scenario 4: the gateway loses power (``kill -9``) while a backlog is queued for the slow uplink.

Before the cut the gateway holds three kinds of durable state: telemetry queued for the cloud (the link is
at 9.6 kbit/s, far below what three thermostats send), state store keys with their versions, and an
offline MQTT 5 session (session expiry 600 s) with QoS 1 messages queued for it. After the gateway comes
back on the same data directory and port and the link speeds up again:

* the backlog drains completely: everything that entered the gateway before or after the cut reaches
  the cloud, each message under the same ``gw-message-id`` as before, duplicates only for messages that
  were in flight at the cut (first sent before it);
* every state store key has its value and its version (HLC) unchanged;
* the durable subscriber reconnects to its session (session present) and gets every queued message, in
  order.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.statestore.client import StateStoreClient
from hil_tests.harness import Recorder, Route, Seen, System, identity_problems
from hil_tests.rig.client import RigClient

pytestmark = pytest.mark.forwarding  # runs in each upstream format of the bench

BACKLOG = 30
QUEUED_FOR_SESSION = 10
COMMANDS = "site/commands"
ROUTES = (Route("alerts", "alerts", priority=0, ttl_s=120), Route("data", "data", priority=1, ttl_s=120))


class SessionClient:
    """An MQTT 5 client with a durable session (expiry 600 s) whose messages the test waits on."""

    def __init__(self, host: str, port: int, client_id: str, recorder: Recorder) -> None:
        self.host, self.port, self.client_id, self.recorder = host, port, client_id, recorder
        self.payloads: list[bytes] = []
        self.session_present: bool | None = None
        self.cond = threading.Condition()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message

    def _on_connect(
        self, client: mqtt.Client, userdata: object, flags: mqtt.ConnectFlags, reason: object, properties: object
    ) -> None:
        with self.cond:
            self.session_present = flags.session_present
            self.cond.notify_all()

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        self.recorder.received(message.payload.decode(), None, self.client_id)
        with self.cond:
            self.payloads.append(message.payload)
            self.cond.notify_all()

    def connect(self) -> bool:
        """Resume (or create) the session; returns CONNACK's session present flag."""
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 600
        self.client.connect(self.host, self.port, clean_start=False, properties=properties)
        self.client.loop_start()
        with self.cond:
            if not self.cond.wait_for(lambda: self.session_present is not None, 10):
                raise TimeoutError(f"{self.client_id}: no CONNACK")
            return bool(self.session_present)

    def subscribe(self, topic: str) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *_: done.set()
        self.client.subscribe(topic, qos=1)
        if not done.wait(10):
            raise TimeoutError(f"{self.client_id}: no SUBACK")

    def wait_for(self, count: int, timeout: float) -> list[bytes]:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.payloads) >= count, timeout):
                raise TimeoutError(f"{self.client_id}: {len(self.payloads)} of {count} messages")
            return list(self.payloads)

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        with self.cond:
            self.session_present = None


def publish_commands(host: str, port: int, recorder: Recorder, device: str) -> list[bytes]:
    """QoS 1 messages for the offline session, each acknowledged (so stored) before the next."""
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"hil-operator-{uuid.uuid4().hex[:6]}",
                            protocol=mqtt.MQTTv5)
    publisher.connect(host, port)
    publisher.loop_start()
    payloads = []
    try:
        for number in range(QUEUED_FOR_SESSION):
            payload = f"command-{number}"
            recorder.sent(payload, None, device)
            publisher.publish(COMMANDS, payload, qos=1).wait_for_publish(10)
            payloads.append(payload.encode())
    finally:
        publisher.disconnect()
        publisher.loop_stop()
    return payloads


def test_queues_state_store_and_sessions_survive_a_power_cut(system: Callable[..., System], rig: RigClient) -> None:
    bench = system(ROUTES, thermostats=3, telemetry_ms=250)
    gateway = bench.gateway
    bench.cloud.wait_for(lambda got: len({m.device for m in got}) == 3, timeout=15, what="telemetry of every thermostat")

    with StateStoreClient(gateway.host, gateway.port, client_id="hil-operator", timeout=5) as store:
        written = {f"site/zone-{n}": f"value-{n}".encode() for n in range(10)} | {t.key: b"22" for t in bench.thermostats}
        versions = {key: store.set(key, value).version for key, value in written.items()}
    subscriber = SessionClient(gateway.host, gateway.port, "hil-durable-subscriber", bench.recorder)
    assert subscriber.connect() is False
    subscriber.subscribe(COMMANDS)
    subscriber.disconnect()
    commands = publish_commands(gateway.host, gateway.port, bench.recorder, subscriber.client_id)

    rig.rate(9600)
    bench.cloud.wait_for(  # woken by each arrival at the cloud, while the tap keeps adding to the backlog
        lambda got: len({m.key for m in bench.tap.snapshot()} - {m.key for m in got}) >= BACKLOG,
        timeout=30, what=f"a backlog of {BACKLOG} messages",
    )
    gateway.kill9()
    cut_ms = int(time.time() * 1000)
    backlog = {m.key for m in bench.tap.snapshot()} - bench.cloud.keys()
    gateway.start()
    rig.rate(0)

    expired = bench.settle()
    arrived = bench.cloud.snapshot()
    copies: dict[str, list[Seen]] = defaultdict(list)
    for message in arrived:
        copies[message.gw_message_id].append(message)
    duplicates = {gw_id: found for gw_id, found in copies.items() if len(found) > 1}
    print(f"power cut with {len(backlog)} messages queued; {len(arrived)} arrivals at the cloud in all, "
          f"{len(duplicates)} messages twice (in flight at the cut)")
    assert not expired, "nothing here may expire: every TTL outlasts the scenario"
    assert backlog <= {m.key for m in arrived}
    assert not identity_problems(bench.tap.snapshot(), arrived), "gw-message-id not stable across the restart"
    late = {gw_id: [m.gw_ms("gw-sent-ms") - cut_ms for m in found]
            for gw_id, found in duplicates.items() if min(m.gw_ms("gw-sent-ms") for m in found) > cut_ms}
    assert not late, f"duplicates of messages first sent after the restart: {late}"

    with StateStoreClient(gateway.host, gateway.port, client_id="hil-auditor", timeout=5) as store:
        after = {key: store.get(key) for key in versions}
    changed = {key: (result.value, str(result.version)) for key, result in after.items()
               if (result.value, result.version) != (written[key], versions[key])}
    assert not changed, f"state store keys changed by the power cut: {changed}"

    assert subscriber.connect() is True, "the durable session did not survive the power cut"
    try:
        assert subscriber.wait_for(len(commands), timeout=10) == commands
    finally:
        subscriber.disconnect()
