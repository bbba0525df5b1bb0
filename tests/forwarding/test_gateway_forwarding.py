"""End to end through the real gateway process: paho devices, the throttling relay, mosquitto as the cloud."""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from testing import paho_clients
from testing.collector import Collector
from testing.waiting import wait_until
from tests.forwarding.peers import delivered
from tests.forwarding.rig import ForwardingRig, manifest

DATA = "FROM /messages/* WHERE $outputName = 'data' INTO $upstream"
ALERTS = "FROM /messages/* WHERE $outputName = 'alerts' INTO $upstream"


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator:
    rigs: list[ForwardingRig] = []

    def make(routes: dict, **kwargs) -> ForwardingRig:
        rig = ForwardingRig(tmp_path, routes, **kwargs)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


def test_routing_and_where_evaluation(make_rig) -> None:
    rig = make_rig({
        "hot": {"route": "FROM /messages/* WHERE $body.temperature > 30 AND site = 'north' INTO $upstream", "priority": 1},
        "debug": 'FROM /messages/* WHERE level = "debug" INTO BrokeredEndpoint("/modules/logger/inputs/debug")',
    })
    local = Collector(rig.gateway.host, rig.gateway.port, "devices/gw1/modules/logger/inputs/debug")
    try:
        device = rig.device("t1")
        json_type = "application/json"
        assert device.publish("data", b'{"temperature": 31}', {"n": "1", "site": "north"}, json_type) == 0
        assert device.publish("data", b'{"temperature": 29}', {"n": "2", "site": "north"}, json_type) == 0
        assert device.publish("data", b'{"temperature": 35}', {"n": "3", "site": "south"}, json_type) == 0
        assert device.publish("data", b'{"temperature": 35}', {"n": "4", "site": "north"}, None) == 0  # not JSON
        assert device.publish("data", b'{"temperature": 40}', {"n": "5", "site": "north"}, json_type) == 0
        assert device.publish("log", b"x", {"n": "6", "level": "debug"}) == 0
        local_received = local.wait_for(1)
        cloud = rig.cloud.wait_for(2)
    finally:
        local.close()
    assert [r.n for r in cloud] == [1, 5]
    assert cloud[0].user_properties["gw-priority"] == "1"
    assert [r.n for r in local_received] == [6]
    assert local_received[0].user_properties["gw-device-id"] == "t1"
    # Nothing else arrives: the last upstream message was published after the refused ones and is in.
    assert len(rig.cloud.messages) == 2


def test_priority_order_under_a_saturated_link(make_rig) -> None:
    rig = make_rig({"data": {"route": DATA, "priority": 9}, "alerts": {"route": ALERTS, "priority": 0}})
    rig.relay.set(rate_bps=24000)
    device = rig.device("t1")
    backlog = 50
    for n in range(backlog):
        device.publish("data", b"d" * 150, {"n": str(n)}, wait=False)
    device.publish("data", b"d", {"n": "999"})  # all acknowledged (in order) once this one is
    already_up = len(rig.cloud.messages)
    for n in range(1000, 1003):
        device.publish("alerts", b"ALERT", {"n": str(n)})
    received = rig.cloud.wait_for(backlog + 4, timeout=60)
    order = [r.n for r in received]
    last_alert = max(order.index(n) for n in range(1000, 1003))
    # The alerts overtake the backlog: they wait for at most the batches in flight when they arrive,
    # and plenty of older data is still queued behind them.
    assert last_alert - already_up <= 12, order
    assert len(order) - 1 - last_alert >= 15, order
    assert {r.user_properties["gw-priority"] for r in received if r.n >= 1000} == {"0"}


def test_batch_format_alerts_overtake_a_saturated_link(make_rig) -> None:
    """The batch format keeps the priority guarantee: an alert waits for the batch PUBLISHes in flight."""
    rig = make_rig({"data": {"route": DATA, "priority": 9}, "alerts": {"route": ALERTS, "priority": 0}},
                   extra_upstream='format = "batch"')
    rig.relay.set(rate_bps=24000)
    device = rig.device("t1")
    backlog = 120
    for n in range(backlog):
        device.publish("data", b"d" * 150, {"n": str(n)}, wait=False)
    device.publish("data", b"d", {"n": "999"})
    for n in range(1000, 1003):
        device.publish("alerts", b"ALERT", {"n": str(n)})
    received = delivered(rig.cloud, backlog + 4, timeout=60)
    order = [r.n for r in received]
    last_alert = max(order.index(n) for n in range(1000, 1003))
    # At 3,000 B/s a batch PUBLISH holds half a second (~10 readings) and two are in flight: the alerts
    # overtake most of the 18 kB backlog.
    assert len(order) - 1 - last_alert >= 60, order
    assert {r.priority for r in received if r.n >= 1000} == {0}
    assert {r.priority for r in received if r.n < 1000} == {9}
    assert len({r.message_id for r in received}) == backlog + 4


def cloud_acl(tmp_path: Path, *writable: str) -> str:
    """mosquitto configuration for a cloud that lets the gateway write only ``writable``."""
    acl = tmp_path / "cloud.acl"
    acl.write_text("topic read #\n" + "".join(f"topic write {topic}\n" for topic in writable))
    # mosquitto started as root would drop to its own user, which cannot read the test's folder
    return f"acl_file {acl}\nuser {getpass.getuser()}\n"


def test_messages_the_cloud_keeps_refusing_go_to_the_dead_letters_and_the_queue_moves_on(make_rig, tmp_path: Path) -> None:
    """The cloud's ACL refuses one device (PUBACK 0x87): without dead letters its message would block the
    queue - and every message behind it - until its TTL ran out."""
    rig = make_rig({"data": {"route": DATA, "priority": 2}},
                   cloud_config=cloud_acl(tmp_path, "gateways/gw1/devices/good/#", "gateways/gw1/metrics"))
    rig.relay.cut()
    rig.relay.set(up=False)
    bad, good = rig.device("bad"), rig.device("good")
    assert bad.publish("data", b"not for the cloud", {"n": "1"}) == 0
    assert good.publish("data", b"fine", {"n": "2"}) == 0
    rig.relay.set(up=True)
    received = delivered(rig.cloud, 1, timeout=20)
    assert [r.n for r in received] == [2]
    rig.gateway.wait_for_log(r"1 messages of priority 2 refused 3 times \(Not authorized \(0x87\)\)")
    assert 'appliance_forwarding_dead_lettered_total{endpoint="upstream",priority="2"} 1' in rig.prometheus()
    # The good message may have reached the cloud in the refused batch, before its own checkpoint: the
    # queue is empty once its (deduplicated) resend is acknowledged.
    wait_until(lambda: 'appliance_forwarding_queue_messages{endpoint="upstream",priority="2"} 0' in rig.prometheus(), 10,
               "the priority 2 queue empty after the dead letter")
    listing = rig.cli("routes", "dead-letters", "--data-dir", str(rig.gateway.data_dir))
    assert listing.returncode == 0, listing.stderr
    [letter] = [json.loads(line) for line in listing.stdout.splitlines()]
    assert (letter["device_id"], letter["priority"], letter["payload_bytes"]) == ("bad", 2, len(b"not for the cloud"))
    assert letter["reason"] == "Not authorized (0x87)"


def test_a_batch_the_cloud_refuses_goes_to_the_dead_letters_whole(make_rig, tmp_path: Path) -> None:
    """A batch PUBLISH is refused as one: all its messages go to the dead letters; other priorities flow."""
    rig = make_rig({"data": {"route": DATA, "priority": 2}, "alerts": {"route": ALERTS, "priority": 1}},
                   extra_upstream='format = "batch"\nbatch_topic = "gateways/{gateway_id}/p{priority}/batches"',
                   cloud_config=cloud_acl(tmp_path, "gateways/gw1/p1/batches", "gateways/gw1/metrics"))
    rig.relay.cut()
    rig.relay.set(up=False)
    device = rig.device("t1")
    for n in range(3):
        assert device.publish("data", b"d", {"n": str(n)}) == 0
    assert device.publish("alerts", b"a", {"n": "10"}) == 0
    rig.relay.set(up=True)
    assert [r.n for r in delivered(rig.cloud, 1, timeout=20)] == [10]
    rig.gateway.wait_for_log(r"3 messages of priority 2 refused 3 times \(Not authorized \(0x87\)\)", timeout=20)
    listing = rig.cli("routes", "dead-letters", "--data-dir", str(rig.gateway.data_dir))
    assert [json.loads(line)["priority"] for line in listing.stdout.splitlines()] == [2, 2, 2]


def test_ttl_expiry_during_an_outage_never_sends(make_rig) -> None:
    rig = make_rig({"short": {"route": ALERTS, "priority": 0, "timeToLiveSecs": 1},
                    "long": {"route": DATA, "priority": 5, "timeToLiveSecs": 600}})
    # The outage cuts a link that is up: a cut before the first CONNACK would leave no disconnect to wait for.
    rig.gateway.wait_for_log(r"upstream connected", timeout=10)
    rig.relay.cut()
    rig.relay.set(up=False)
    device = rig.device("t1")
    for n in range(3):
        device.publish("alerts", b"a", {"n": str(n)})
        device.publish("data", b"d", {"n": str(100 + n)})
    rig.gateway.wait_for_log(r"upstream disconnected", timeout=10)
    rig.wait_for_log_total(r"cleanup removed \d+ expired messages: .*upstream_Pri0=(\d+)", 3)
    assert 'appliance_forwarding_expired_total{endpoint="upstream",priority="0"} 3' in rig.prometheus()
    rig.relay.set(up=True)
    received = rig.cloud.wait_for(3, timeout=30)
    assert sorted(r.n for r in received) == [100, 101, 102]
    # The data messages were queued after the alerts and have all arrived; the alerts never will.
    assert all(r.n >= 100 for r in rig.cloud.messages)


@pytest.mark.parametrize("upstream_format", ["message", "batch"])
def test_restart_with_a_backlog_after_kill9_loses_nothing(make_rig, upstream_format: str) -> None:
    rig = make_rig({"data": {"route": DATA, "priority": 3}}, extra_upstream=f'format = "{upstream_format}"')
    rig.relay.cut()
    rig.relay.set(up=False)
    device = rig.device("t1")
    for n in range(40):
        assert device.publish("data", b"d" * 50, {"n": str(n)}) == 0  # PUBACK: stored
    device.close()
    rig.gateway.kill9()
    rig.gateway.start()
    rig.relay.set(up=True)
    received = delivered(rig.cloud, 40, timeout=30)
    assert sorted({r.n for r in received}) == list(range(40))
    assert {r.priority for r in received} == {3}


def test_manifest_reload_keeps_pending_messages_as_stored(make_rig) -> None:
    rig = make_rig({"data": {"route": DATA, "priority": 9, "timeToLiveSecs": 600}})
    rig.relay.cut()
    rig.relay.set(up=False)
    device = rig.device("t1")
    for n in range(3):
        device.publish("data", b"old", {"n": str(n)})
    rig.manifest_path.write_text(manifest({"data": {"route": DATA, "priority": 2, "timeToLiveSecs": 1}}))
    result = rig.cli("routes", "reload", "--data-dir", str(rig.gateway.data_dir))
    assert result.returncode == 0, result.stderr
    assert rig.status()["routes"][0]["priority"] == 2
    for n in range(3, 5):
        device.publish("data", b"new", {"n": str(n)})
    rig.relay.set(up=True)
    received = rig.cloud.wait_for(5, timeout=30)
    by_n = {r.n: r.user_properties for r in received}
    # Stored before the reload: P9 with a 600 s TTL, and still alive although the new TTL is 1 s.
    assert {by_n[n]["gw-priority"] for n in range(3)} == {"9"}
    assert {by_n[n]["gw-ttl-s"] for n in range(3)} == {"600"}
    assert all(n < 3 or by_n[n]["gw-priority"] == "2" for n in by_n)


def test_sighup_and_file_change_reload_and_malformed_manifests_are_refused(make_rig) -> None:
    rig = make_rig({"data": {"route": DATA, "priority": 4}})
    device = rig.device("t1")
    bad = manifest({"data": {"route": DATA, "priority": 12}})
    rig.manifest_path.write_text(bad)  # the file watcher picks this up
    rig.gateway.wait_for_log(r"rejected, keeping 1 running routes: \$\.\$edgeHub\.properties\.desired\.routes\.data\.priority")
    device.publish("data", b"x", {"n": "1"})
    assert rig.cloud.wait_for(1)[0].user_properties["gw-priority"] == "4", "the old routes still run"

    check = rig.cli("routes", "check", str(rig.manifest_path))
    assert check.returncode == 1 and "routes.data.priority" in check.stderr

    rig.manifest_path.write_text("{ not json")
    rig.gateway.signal(signal.SIGHUP)
    rig.gateway.wait_for_log(r"not valid JSON: line 1 column 3")
    rig.manifest_path.write_text(manifest({"data": {"route": "FROM /messages/* WHERE (x = 'y' INTO $upstream"}}))
    result = rig.cli("routes", "reload", "--data-dir", str(rig.gateway.data_dir))
    assert result.returncode == 1 and "column" in result.stderr

    rig.manifest_path.write_text(manifest({"data": {"route": DATA, "priority": 7}}))
    os.kill(rig.gateway.process.pid, signal.SIGHUP)
    rig.wait_for_log_count(r"routes loaded from .*: 1 routes", 2)  # the first one was at startup
    device.publish("data", b"x", {"n": "2"})
    assert rig.cloud.wait_for(2)[1].user_properties["gw-priority"] == "7"
    shown = json.loads(rig.cli("routes", "show", "--data-dir", str(rig.gateway.data_dir)).stdout)
    assert shown["routes"][0]["priority"] == 7 and shown["error"] is None


def test_disk_full_drops_lowest_priority_and_never_an_alert(make_rig) -> None:
    rig = make_rig({"data": {"route": DATA, "priority": 9}, "alerts": {"route": ALERTS, "priority": 0}},
                   extra_forwarding="max_store_bytes = 8192")
    rig.relay.cut()
    rig.relay.set(up=False)
    device = rig.device("t1")
    for n in range(30):
        assert device.publish("data", b"d" * 400, {"n": str(n)}) == 0
    for n in range(100, 130):
        assert device.publish("alerts", b"a" * 400, {"n": str(n)}) == 0
    # Full of alerts now: more data is refused (MQTT 5 PUBACK 0x97 quota exceeded), nothing else dropped.
    assert device.publish("data", b"d" * 400, {"n": "999"}) == 0x97
    metrics = rig.prometheus()
    assert 'appliance_forwarding_dropped_total{endpoint="upstream",priority="9"} 31' in metrics
    rig.relay.set(up=True)
    alert_queue = 'appliance_forwarding_queue_messages{endpoint="upstream",priority="0"}'
    kept_alerts = [line for line in metrics.splitlines() if line.startswith(alert_queue)]
    depth = int(float(kept_alerts[0].rsplit(" ", 1)[1]))
    received = rig.cloud.wait_for(depth, timeout=30)
    assert all(r.n >= 100 for r in received)
    assert sorted(r.n for r in received) == list(range(130 - depth, 130)), "oldest alerts dropped to fit newer alerts"


def test_metrics_on_sys_topic_prometheus_and_upstream(make_rig) -> None:
    rig = make_rig({"data": {"route": DATA, "priority": 6}}, extra_forwarding="metrics_interval_s = 0.3")
    local = Collector(rig.gateway.host, rig.gateway.port, "$SYS/gateway/forwarding/metrics")
    try:
        device = rig.device("t1")
        device.publish("data", b"x", {"n": "1"})
        sys_doc = json.loads(local.wait_for(1)[0].payload)
    finally:
        local.close()
    assert sys_doc["gateway_id"] == "gw1" and "upstream" in sys_doc["links"]
    upstream_doc = json.loads(rig.cloud.wait_for_topic("gateways/gw1/metrics").payload)
    assert set(upstream_doc) >= {"gateway_id", "ts_ms", "endpoints"}
    # The metrics document may reach the cloud before the message does (the pump sends the message when
    # its window allows): the counter is read once the cloud has the message, and counted after its PUBACK.
    [message] = delivered(rig.cloud, 1)
    assert message.n == 1
    forwarded = 'appliance_forwarding_forwarded_total{endpoint="upstream",priority="6"} 1'
    wait_until(lambda: forwarded in rig.prometheus(), 10, lambda: f"{forwarded!r} not in {rig.prometheus()}")
    assert 'appliance_link_connected{endpoint="upstream"} 1' in rig.prometheus()


@pytest.mark.parametrize("upstream_format", ["message", "batch"])
def test_a_311_thermostat_raises_a_p0_alert_by_topic_alone(make_rig, upstream_format: str) -> None:
    """MQTT 3.1.1 has no user properties: the IoT Hub property bag in the topic carries ``alert=true``,
    and ``WHERE alert = 'true'`` routes it at priority 0 while the same device's data goes at 5."""
    rig = make_rig({
        "data": {"route": "FROM /messages/* INTO $upstream", "priority": 5},
        "alerts": {"route": "FROM /messages/* WHERE alert = 'true' INTO $upstream", "priority": 0, "timeToLiveSecs": 600},
    }, extra_upstream=f'format = "{upstream_format}"')
    thermostat = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="thermo-311", protocol=mqtt.MQTTv311)
    thermostat.connect(rig.gateway.host, rig.gateway.port)
    thermostat.loop_start()
    try:
        for topic in (
            "devices/thermo-311/messages/events/data/n=1",
            "devices/thermo-311/messages/events/alert=true&n=2&%24.ct=application%2Fjson",  # IoT Hub's own form
            "devices/thermo-311/messages/events/alerts/alert=true&n=3/",  # the firmware's output, plus a bag
            "devices/thermo-311/messages/events/n=4&alert=false",
        ):
            thermostat.publish(topic, b'{"t": 21.5}', qos=1).wait_for_publish(10)
        got = {d.n: d for d in delivered(rig.cloud, 4)}
    finally:
        paho_clients.close(thermostat)
    assert {n: d.priority for n, d in got.items()} == {1: 5, 2: 0, 3: 0, 4: 5}


def test_the_tooling_says_what_it_does(make_rig) -> None:
    """Issue 14's tooling: the metrics port in the ready line and in ``doctor``; ``routes show`` gives the
    effective TTL and its origin; ``routes check --message`` says when a message is routed nowhere and why."""
    rig = make_rig({
        "alerts": {"route": "FROM /messages/* WHERE alert = 'true' INTO $upstream", "priority": 0, "timeToLiveSecs": 600},
        "data": {"route": "FROM /messages/modules/m1/* WHERE as_number(level) > 3 INTO $upstream", "priority": 5},
    })
    url = rig.metrics_url()
    rig.gateway.wait_for_log(rf"appliance ready: .*; metrics on {re.escape(url)}")

    doctor = rig.cli("doctor", "-c", str(rig.config), "--listen", f"127.0.0.1:{rig.gateway.port}",
                     "--data-dir", str(rig.gateway.data_dir))
    assert f"ok       metrics   metrics on {url}" in doctor.stdout, doctor.stdout

    shown = {r["name"]: r for r in json.loads(rig.cli("routes", "show", "--data-dir", str(rig.gateway.data_dir)).stdout)["routes"]}
    assert (shown["alerts"]["effectiveTimeToLiveSecs"], shown["alerts"]["timeToLiveFrom"]) == (600, "route timeToLiveSecs")
    assert (shown["data"]["timeToLiveSecs"], shown["data"]["effectiveTimeToLiveSecs"]) == (0, 7200)
    assert shown["data"]["timeToLiveFrom"] == "storeAndForwardConfiguration.timeToLiveSecs"

    nowhere = rig.cli("routes", "check", str(rig.manifest_path), "--message",
                      json.dumps({"topic": "devices/t1/messages/events/alert=false&level=9"}))
    assert nowhere.returncode == 0
    assert "routed nowhere" in nowhere.stdout
    assert "not alerts: WHERE alert = 'true' is false" in nowhere.stdout
    assert "not data: source /messages/events is not under FROM /messages/modules/m1/*" in nowhere.stdout
    routed = rig.cli("routes", "check", str(rig.manifest_path), "--message",
                     json.dumps({"topic": "devices/t1/messages/events/alert=true"}))
    assert "routed: upstream priority 0 TTL 600s" in routed.stdout and "routed nowhere" not in routed.stdout
    undefined = rig.cli("routes", "check", str(rig.manifest_path), "--message",
                        json.dumps({"topic": "devices/t1/modules/m1/messages/events/%24.on=o1"}))
    assert "not data: WHERE as_number(level) > 3 is undefined" in undefined.stdout, undefined.stdout


def test_refusal_counts_survive_a_restart(make_rig, tmp_path: Path) -> None:
    """Three refusals in all, not three per process: the counts are stored with the checkpoints."""
    rig = make_rig({"data": {"route": DATA, "priority": 2}}, cloud_config=cloud_acl(tmp_path, "gateways/gw1/metrics"))
    refused = r"batch of 1 failed \(refused: Not authorized \(0x87\)\)"
    assert rig.device("bad").publish("data", b"not for the cloud", {"n": "1"}) == 0
    rig.wait_for_log_count(refused, 1)
    rig.relay.set(up=False)  # the retries back off 0.1 s, then 0.2 s: no third try before the power cut
    rig.gateway.kill9()
    before = len(re.findall(refused, rig.gateway.output()))
    assert before in (1, 2)
    rig.relay.cut()
    rig.relay.set(up=True)
    rig.gateway.start()
    rig.gateway.wait_for_log(r"1 messages of priority 2 refused 3 times", timeout=20)
    # The third refusal is the one that dead-letters (it logs that instead of a retry).
    assert len(re.findall(refused, rig.gateway.output())) == 2, rig.gateway.output()


def test_the_metrics_endpoint_counts_the_brokers_queue_full_drops(make_rig) -> None:
    """Issue 12 item 5: a QoS 1 message that no longer fits a durable session's ``max_queued_bytes`` is
    counted on the gateway's Prometheus endpoint (and the MQTT 5 publisher got 0x97)."""
    rig = make_rig({"data": {"route": "FROM /messages/* INTO $upstream", "priority": 0}},
                   extra_upstream="[broker.limits]\nmax_queued_bytes = 100\n")
    assert "appliance_broker_messages_queue_full_total 0\n" in rig.prometheus()
    away = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="metrics-away", protocol=mqtt.MQTTv311,
                       clean_session=False)
    away.connect(rig.gateway.host, rig.gateway.port)
    away.subscribe("plain/#", 1)
    away.loop_start()
    wait_until(lambda: away.is_connected())
    away.disconnect()
    away.loop_stop()
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="metrics-publisher", protocol=mqtt.MQTTv5)
    codes: list[int] = []
    publisher.on_publish = lambda client, userdata, mid, reason_code, properties: codes.append(reason_code.value)
    publisher.connect(rig.gateway.host, rig.gateway.port)
    publisher.loop_start()
    try:
        for _ in range(3):
            publisher.publish("plain/t", b"x" * 60, 1).wait_for_publish(10)
    finally:
        publisher.disconnect()
        publisher.loop_stop()
    assert codes == [0, 0x97, 0x97]
    text = rig.prometheus()
    assert "appliance_broker_messages_queue_full_total 2\n" in text and "# TYPE appliance_broker_messages_queue_full_total counter" in text
