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

import time
import uuid
from collections import defaultdict
from collections.abc import Callable

import paho.mqtt.client as mqtt
import pytest

from appliance.statestore.client import StateStoreClient
from hil_tests.harness import Recorder, Route, Seen, System, identity_problems
from hil_tests.rig.client import RigClient
from testing.collector import Collector, Received

pytestmark = pytest.mark.forwarding  # runs in each upstream format of the bench

BACKLOG = 30
QUEUED_FOR_SESSION = 10
COMMANDS = "site/commands"
ROUTES = (Route("alerts", "alerts", priority=0, ttl_s=120), Route("data", "data", priority=1, ttl_s=120))


class SessionClient(Collector[Received]):
    """One connection of an MQTT 5 subscriber with a durable session (expiry 600 s): built again with the
    same client id, it resumes the session; what it receives goes to the recorder."""

    def __init__(self, host: str, port: int, client_id: str, recorder: Recorder, topics: tuple[str, ...] = ()) -> None:
        self.recorder = recorder
        super().__init__(host, port, topics, client_id=client_id, name=client_id, clean_start=False, session_expiry=600)

    def record(self, item: Received) -> None:
        self.recorder.received(item.payload.decode(), None, self.name)


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
    with SessionClient(gateway.host, gateway.port, "hil-durable-subscriber", bench.recorder, (COMMANDS,)) as subscriber:
        assert subscriber.session_present is False
    commands = publish_commands(gateway.host, gateway.port, bench.recorder, subscriber.name)

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

    with SessionClient(gateway.host, gateway.port, subscriber.name, bench.recorder) as resumed:
        assert resumed.session_present is True, "the durable session did not survive the power cut"
        assert [m.payload for m in resumed.wait_for(len(commands), timeout=10)] == commands
