"""Forwarding never stops or stalls on one message (issue 24), end to end: the real gateway process, paho
devices over MQTT 5 and 3.1.1, the throttling relay, mosquitto as the cloud."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.forwarding.metrics import ForwardingMetrics
from appliance.forwarding.pump import Pump
from appliance.forwarding.queues import MessageStore
from appliance.forwarding.upstream import UpstreamSender
from appliance.store_thread import StoreThread
from testing.collector import Collector
from testing.processes import MosquittoProcess
from testing.waiting import wait_until
from tests.forwarding.peers import delivered
from tests.forwarding.rig import ForwardingRig
from tests.forwarding.test_gateway_forwarding import cloud_acl
from tests.forwarding.test_upstream import run_bridge, until_empty

EVERYTHING = "FROM /messages/* INTO $upstream"
ALERTS = "FROM /messages/* WHERE alert = 'true' INTO $upstream"
#: Every device-controlled field of the topic template, as the issue's report had it.
TEMPLATE = 'topic_template = "gateways/{gateway_id}/devices/{device_id}/modules/{module_id}/outputs/{output}/{message_id}"'
FAST_METRICS = "metrics_interval_s = 0.3"
V311, V5 = 4, 5


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ForwardingRig]:
    options = getattr(request, "param", {})
    made = ForwardingRig(tmp_path, {"data": {"route": EVERYTHING, "priority": 2},
                                    "alerts": {"route": ALERTS, "priority": 0}},
                         extra_forwarding=FAST_METRICS, extra_upstream=TEMPLATE, **options)
    yield made
    made.close()


def test_a_wildcard_from_a_device_is_refused_and_an_alert_after_it_arrives(rig: ForwardingRig) -> None:
    """Before: PUBACK 0, then paho's ``publish`` raised ``ValueError`` on the ``#`` in the topic and the
    pump task ended without a log line: the alert never arrived, and after a restart the same message
    killed the pump again."""
    v5, v311 = rig.device("d1"), rig.device("d2", V311)
    assert v5.publish_topic("devices/d1/modules/m/messages/events/$.on=%23", b"{}") == 0x90
    assert v311.publish_topic("devices/d2/modules/m/messages/events/$.on=%23", b"{}") == 0  # 3.1.1: no reason codes
    assert v5.publish_topic("devices/d1/modules/m/messages/events/$.on=a%2B", b"{}") == 0x90
    assert v5.publish_topic("devices/d1/messages/events/alerts/alert=true&n=1", b"!") == 0
    [alert] = delivered(rig.cloud, 1)
    assert alert.n == 1 and alert.priority == 0
    document = rig.metrics_document(lambda d: d["refused"].get("wildcard") == 3)
    assert document["pump"]["upstream"]["running"] is True and document["pump"]["upstream"]["restarts"] == 0
    assert 'appliance_forwarding_refused_total{reason="wildcard"} 3' in rig.prometheus()
    assert 'appliance_forwarding_pump_running{endpoint="upstream"} 1' in rig.prometheus()
    # Logged, rate-limited: one line for the three refusals of one reason.
    assert rig.gateway.output().count("reason code 0x90, wildcard") == 1
    assert "from d1 on 'devices/d1/modules/m/messages/events/$.on=%23'" in rig.gateway.output()


def test_a_line_feed_or_a_tab_from_a_device_cannot_stall_its_queue(rig: ForwardingRig) -> None:
    """Before: the line feed went upstream as a user property, mosquitto closed the connection on it, the
    gateway reconnected about once a second and sent it again, and everything behind it waited for the
    TTL. Now it is refused where it enters; what follows at the same priority arrives at once."""
    v311 = rig.device("edge", V311)
    assert v311.publish_topic("devices/edge/messages/events/note=line1%0Aline2", b"x") == 0
    assert v311.publish_topic("devices/ed\tge/messages/events/n=1", b"x") == 0
    v5 = rig.device("five")
    assert v5.publish_topic("devices/five/messages/events/data", b"x", [("note", "line1\nline2")]) == 0x99
    assert v311.publish_topic("devices/edge/messages/events/n=2", b"ok") == 0
    [after] = delivered(rig.cloud, 1, timeout=10)
    assert after.n == 2
    # A document taken after n=2 went out (the refusals come first, so an earlier one may have no queue yet).
    document = rig.metrics_document(lambda d: d["refused"].get("control_character") == 3
                                    and d["endpoints"].get("upstream", {}).get("2", {}).get("sent", 0) >= 1)
    assert document["endpoints"]["upstream"]["2"]["dead_lettered"] == 0
    assert "upstream disconnected" not in rig.gateway.output(), "the cloud never saw the control characters"


def test_bags_that_do_not_decode_are_refused_and_unrouted_messages_counted(rig: ForwardingRig) -> None:
    """Before: PUBACK 0x00, no log, no counter - the messages vanished."""
    v5, v311 = rig.device("d1"), rig.device("d2", V311)
    assert v5.publish_topic("devices/d1/messages/events/a=%FF%FE", b"x") == 0x90
    assert v5.publish_topic("devices/d1/messages/events/=v", b"x") == 0x90
    assert v311.publish_topic("devices/d2/messages/events/a=%FF%FE", b"x") == 0
    rig.manifest_path.write_text(rig.manifest_path.read_text().replace(EVERYTHING, "FROM /messages/* WHERE n = '9' INTO $upstream"))
    rig.wait_for_log_count("routes loaded", 2)
    assert v5.publish_topic("devices/d1/messages/events/n=1", b"x") == 0  # no route takes it
    document = rig.metrics_document(lambda d: d["unrouted"] == 1 and d["refused"].get("bag_not_utf8") == 2)
    assert document["refused"] == {"bag_not_utf8": 2, "empty_property_name": 1}
    # The upstream pump is in the document from the start, before any message was queued for it.
    assert document["pump"]["upstream"] == {"running": True, "restarts": 0, "head_moved_ms": None}
    page = rig.prometheus()
    assert "appliance_forwarding_unrouted_total 1" in page
    assert 'appliance_forwarding_refused_total{reason="empty_property_name"} 1' in page
    output = rig.gateway.output()
    assert "bag_not_utf8" in output and "empty_property_name" in output


def test_one_message_the_cloud_refuses_leaves_the_others_of_its_batch_delivered_once(
        make_rig_with_acl: ForwardingRig) -> None:
    """Before: the cloud refused one message of a batch and the good ones sent after it in the same
    window were sent again with it, three times, until it went to the dead letters."""
    rig = make_rig_with_acl
    rig.relay.cut()
    rig.relay.set(up=False)
    good, bad = rig.device("good"), rig.device("bad")
    assert good.publish_topic("devices/good/messages/events/n=1", b"g") == 0
    assert bad.publish_topic("devices/bad/messages/events/n=2", b"b") == 0
    for n in range(3, 9):
        assert good.publish_topic(f"devices/good/messages/events/n={n}", b"g") == 0
    rig.relay.set(up=True)
    delivered(rig.cloud, 7, timeout=20)
    rig.gateway.wait_for_log(r"1 messages of priority 2 refused 3 times \(Not authorized \(0x87\)\)", timeout=20)
    wait_until(lambda: 'appliance_forwarding_queue_messages{endpoint="upstream",priority="2"} 0' in rig.prometheus(), 10,
               "the queue empty after the dead letter")
    counts = Counter(d.n for d in delivered(rig.cloud, 7))
    assert counts == {n: 1 for n in (1, 3, 4, 5, 6, 7, 8)}, counts


@pytest.fixture
def make_rig_with_acl(tmp_path: Path) -> Iterator[ForwardingRig]:
    made = ForwardingRig(tmp_path, {"data": {"route": EVERYTHING, "priority": 2}},
                         extra_upstream='topic_template = "gateways/{gateway_id}/devices/{device_id}/messages/events"',
                         cloud_config=cloud_acl(tmp_path, "gateways/gw1/devices/good/#", "gateways/gw1/metrics"))
    yield made
    made.close()


def forward_a_big_message_between_two(tmp_path: Path, protocol: str, timeout_s: float, reason: str,
                                      **bridge_options: str) -> tuple[list[Any], UpstreamSender, ForwardingMetrics]:
    """Messages 0, 1 (2,000 bytes) and 2 forwarded to a mosquitto that takes packets of 1,024 bytes at
    most, until the store is empty (within ``timeout_s``) and 1 is its one dead letter, for ``reason``.
    Returns what mosquitto received, the sender and its metrics."""
    with MosquittoProcess(tmp_path / "small", extra_config="max_packet_size 1024\n") as small:
        collector = Collector(small.host, small.port, "gateways/#")
        try:
            async def scenario(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
                await add(0)
                await add(1, size=2000)
                await add(2)
                await until_empty(store, thread, timeout_s)
                [letter] = await thread.call(store.dead_letters)
                assert letter.message.app_property("n") == "1"
                assert reason in letter.reason

            sender, metrics = run_bridge(tmp_path, small.port, protocol, scenario, **bridge_options)
            return collector.wait_for(2), sender, metrics
        finally:
            collector.close()


def test_a_message_above_the_clouds_maximum_packet_size_is_dead_lettered_at_once(tmp_path: Path) -> None:
    """MQTT 5: mosquitto announces ``max_packet_size`` in its CONNACK. Before, the gateway sent the big
    message anyway, mosquitto closed the connection, and the gateway reconnected and sent it again until
    its TTL ran out, with everything behind it waiting."""
    received, sender, metrics = forward_a_big_message_between_two(
        tmp_path, "5", 15, "exceeds the server's Maximum Packet Size of 1024")
    assert sorted(r.n for r in received) == [0, 2]
    assert sender.connects == 1, "never disconnected"
    assert metrics.counters["dead_lettered"][("upstream", 0)] == 1


def test_a_message_the_cloud_disconnects_on_is_dead_lettered_after_three_drops(tmp_path: Path) -> None:
    """MQTT 3.1.1 learns no Maximum Packet Size: mosquitto just closes the connection on the big message.
    After the third drop with it alone in flight it goes to the dead letters; the next one arrives."""
    received, sender, _ = forward_a_big_message_between_two(
        tmp_path, "3.1.1", 20, "dropped 3 times", topic_template="gateways/{gateway_id}/{message_id}")
    ids = sorted(r.topic.rpartition("/")[2] for r in received)
    assert [i.partition(":")[0] for i in ids] == ["gw1", "gw1"]
    first, last = (int(i.partition(":")[2]) for i in ids)
    assert last == first + 2, f"messages 0 and 2 arrived, 1 (between them) did not: {ids}"
    assert sender.connects == 4, "the first connection and one after each of the three drops"
