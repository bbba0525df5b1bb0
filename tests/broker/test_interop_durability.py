"""kill -9 with QoS 1/2 traffic in flight, then restart on the same data dir: nothing acknowledged is lost
and nothing QoS 2 is delivered twice.

One real restart per durability property, so a test costs a gateway start or two: rather than run each
twice, each test puts MQTT 3.1.1 and 5 clients side by side through the same kill -9 (a 3.1.1 durable
session is clean session off; it has no expiry property). The tests of wills that wait out a delay are
MQTT 5 only: 3.1.1 has no Will Delay Interval. What time does to a session or a will without a restart
is tested on the fake clock (test_timing.py)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import psutil
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr
from appliance.broker.codec.writer import encode
from testing import run_queue
from testing.processes import GatewayProcess
from testing.waiting import wait_until
from tests.broker.clients import PahoClient, RawClient
from tests.broker.versions import durable

EXPIRY = {pr.SESSION_EXPIRY_INTERVAL: 3600}


def drain(client: RawClient, idle: float = 1.5) -> list[pk.Publish]:
    """Read and acknowledge publishes until none arrives for ``idle`` seconds."""
    got: list[pk.Publish] = []
    while True:
        try:
            packet = client.recv(timeout=idle)
        except TimeoutError:
            return got
        if isinstance(packet, pk.Publish):
            got.append(packet)
            client.send(pk.PubAck(packet.packet_id))


def subscribe_and_go_away(port: int, client_id: str, topic_filter: str, qos: int, level: int = pk.MQTT_5,
                          **session: Any) -> None:
    """``client_id`` subscribes to ``topic_filter`` (``session``: its CONNECT's session fields) and
    disconnects: what is published to it from now on waits for it, if its session outlives the connection."""
    client = RawClient(port, level)
    client.connect(client_id, **session)
    client.subscribe(topic_filter, qos)
    client.send(pk.Disconnect())
    client.expect_closed()


def test_acknowledged_qos1_messages_survive_kill9(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        subscribe_and_go_away(gateway.port, "durable-offline", "load/#", 1, level=pk.MQTT_311, **durable(pk.MQTT_311))
        online = RawClient(gateway.port)
        online.connect("durable-online", properties={**EXPIRY, pr.RECEIVE_MAXIMUM: 10})
        online.subscribe("load/#", 1)

        publisher = RawClient(gateway.port)
        publisher.connect("publisher")
        acked: set[int] = set()
        sent = 0
        killed = False
        try:
            while sent < 3000:
                batch = b"".join(
                    encode(
                        pk.Publish(f"load/{index % 7}", str(index).encode(), 1, packet_id=index % 65535 + 1), 5
                    )
                    for index in range(sent, sent + 50)
                )
                publisher.sock.sendall(batch)
                sent += 50
                for _ in range(50):
                    ack = publisher.expect(pk.PubAck)
                    acked.add(ack.packet_id)
                if len(acked) >= 400 and not killed:
                    gateway.kill9()  # with the next batch possibly half-read by the broker
                    killed = True
        except (ConnectionError, OSError, TimeoutError):
            pass
        assert killed and len(acked) >= 400
        # Packet ids equal index + 1 here (fewer than 65535 messages), so acked ids name the payloads.
        acknowledged = {str(packet_id - 1).encode() for packet_id in acked}
        received_before = set()
        for packet in online.pending:
            if isinstance(packet, pk.Publish):
                received_before.add(packet.payload)
        online.close()
        publisher.close()

        gateway.start()
        for client_id, level in (("durable-offline", pk.MQTT_311), ("durable-online", pk.MQTT_5)):
            client = RawClient(gateway.port, level)
            connack = client.connect(client_id, **durable(level, 3600))
            assert connack.session_present
            payloads = {publish.payload for publish in drain(client)}
            missing = acknowledged - payloads
            if client_id == "durable-online":
                missing -= received_before
            assert not missing, f"{client_id}: {len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
            client.send(pk.Disconnect())
            client.close()


def test_inbound_qos2_state_survives_kill9(tmp_path: Path) -> None:
    """A 3.1.1 and an MQTT 5 publisher each have a QoS 2 message PUBREC'd at the kill; both resend it
    after the restart, and the (3.1.1) subscriber gets each exactly once."""
    publishers = {pk.MQTT_5: "q2-pub", pk.MQTT_311: "q2-pub-311"}
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        subscribe_and_go_away(gateway.port, "q2-sub", "q2/#", 2, level=pk.MQTT_311, **durable(pk.MQTT_311))
        for level, client_id in publishers.items():
            publisher = RawClient(gateway.port, level)
            publisher.connect(client_id, **durable(level, 3600))
            publisher.send(pk.Publish(f"q2/{client_id}", b"exactly once", 2, packet_id=7))
            publisher.expect(pk.PubRec)
            publisher.close()
        gateway.kill9()

        gateway.start()
        for level, client_id in publishers.items():
            publisher = RawClient(gateway.port, level)
            assert publisher.connect(client_id, **durable(level, 3600)).session_present
            publisher.send(pk.Publish(f"q2/{client_id}", b"exactly once", 2, dup=True, packet_id=7))  # PUBREC lost
            publisher.expect(pk.PubRec)
            publisher.send(pk.PubRel(7))
            assert publisher.expect(pk.PubComp).reason_code == 0
            publisher.close()

        subscriber = RawClient(gateway.port, pk.MQTT_311)
        subscriber.connect("q2-sub", **durable(pk.MQTT_311))
        delivered = [subscriber.expect(pk.Publish) for _ in publishers]  # both fit in the in-flight window
        assert sorted((p.topic, p.payload) for p in delivered) == sorted(
            (f"q2/{client_id}", b"exactly once") for client_id in publishers.values())
        for publish in delivered:
            subscriber.send(pk.PubRec(publish.packet_id))
            assert subscriber.expect(pk.PubRel).packet_id == publish.packet_id
            subscriber.send(pk.PubComp(publish.packet_id))
        subscriber.send(pk.PingReq())
        assert isinstance(subscriber.recv(), pk.PingResp)  # no second copy
        subscriber.close()


def test_retained_messages_and_subscriptions_survive_kill9(tmp_path: Path) -> None:
    keepers = {pk.MQTT_5: "keeper", pk.MQTT_311: "keeper-311"}
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        clients = {}
        for level, client_id in keepers.items():
            clients[level] = RawClient(gateway.port, level)
            clients[level].connect(client_id, **durable(level, 3600))
            clients[level].subscribe("kept/#", 1)
        client = clients[pk.MQTT_5]
        client.send(pk.Publish("kept/state", b"on", 1, retain=True, packet_id=1))
        # Its PUBACK and the copy for its own subscription, in either order.
        assert {type(client.recv()), type(client.recv())} == {pk.PubAck, pk.Publish}
        assert clients[pk.MQTT_311].expect(pk.Publish).payload == b"on"  # routed before the PUBACK
        gateway.kill9()
        for raw in clients.values():
            raw.close()
        gateway.start()
        fresh = RawClient(gateway.port)
        fresh.connect("fresh")
        fresh.subscribe("kept/#", 0)
        retained = fresh.expect(pk.Publish)
        assert (retained.topic, retained.payload, retained.retain) == ("kept/state", b"on", True)
        again = {}
        for level, client_id in keepers.items():
            again[level] = RawClient(gateway.port, level)
            assert again[level].connect(client_id, **durable(level, 3600)).session_present
        fresh.send(pk.Publish("kept/new", b"live"))
        for raw in again.values():
            publish = raw.recv()
            while isinstance(publish, pk.Publish) and publish.topic == "kept/state":
                raw.send(pk.PubAck(publish.packet_id))  # the unacknowledged copy, redelivered
                publish = raw.recv()
            assert isinstance(publish, pk.Publish) and publish.payload == b"live"
        for raw in (fresh, *again.values()):
            raw.close()


def test_sigterm_shuts_down_cleanly(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data").start()
    try:
        client = RawClient(gateway.port)
        client.connect("bye")
        client311 = RawClient(gateway.port, level=pk.MQTT_311)
        client311.connect("bye-311")
        assert gateway.terminate() == 0
        seen = client.expect_closed()
        assert seen and isinstance(seen[-1], pk.Disconnect) and seen[-1].reason_code == 0x8B
        assert client311.expect_closed() == []  # 3.1.1 has no server DISCONNECT
        client.close()
        client311.close()
    finally:
        gateway.kill9()


def test_will_of_a_client_connected_during_kill9_is_sent_after_restart(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        subscribe_and_go_away(gateway.port, "will-watcher", "status/#", 1, properties=EXPIRY)
        devices = []
        for level, name in ((pk.MQTT_5, "device"), (pk.MQTT_311, "device-311")):
            device = RawClient(gateway.port, level)
            device.connect(name, will=pk.Will(f"status/{name}", b"offline", 1), **durable(level, 3600))
            device.send(pk.PingReq())
            device.expect(pk.PingResp)  # the session (with its will) is committed by now
            devices.append(device)
        gateway.kill9()
        for device in devices:
            device.close()
        gateway.start()
        watcher = RawClient(gateway.port)
        watcher.connect("will-watcher", clean_start=False, properties=EXPIRY)
        wills = sorted((will.topic, will.payload) for will in (watcher.expect(pk.Publish), watcher.expect(pk.Publish)))
        assert wills == [("status/device", b"offline"), ("status/device-311", b"offline")]
        watcher.close()


def test_2000_acknowledged_messages_for_an_away_session_survive_kill9_with_the_defaults(tmp_path: Path) -> None:
    """No acknowledged QoS 1 message for a durable session is dropped by default: the queue is bounded
    by bytes of disk (``max_queued_bytes``), not by a count of 1,000 (which kept 1,000 of these 2,000).
    The away session is a 3.1.1 one (clean session off), the publisher MQTT 5."""
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        away = PahoClient(gateway.port, "away-2000", v5=False, clean=False)
        away.connect(session_expiry=3600)
        away.subscribe("backlog/#", 1)
        away.disconnect()
        publisher = PahoClient(gateway.port, "backlog-publisher")
        publisher.connect()
        payloads = [f"{index:06d}".encode().ljust(4096, b"x") for index in range(2000)]
        infos = [publisher.client.publish("backlog/t", payload, 1) for payload in payloads]
        for info in infos:
            info.wait_for_publish(timeout=30)
        with publisher._lock:
            codes = [publisher._ack_codes[info.mid] for info in infos]
        assert all(not code.is_failure for code in codes)
        publisher.stop()
        gateway.kill9()
        gateway.start()

        back = PahoClient(gateway.port, "away-2000", v5=False, clean=False)
        flags, _, _ = back.connect(session_expiry=3600)
        assert flags.session_present
        received = [back.get(timeout=30).payload for _ in range(2000)]
        assert received == payloads
        # Published after the backlog, so queued behind it: nothing of the backlog comes a second time first.
        sentinel = PahoClient(gateway.port, "backlog-sentinel")
        sentinel.connect()
        sentinel.publish("backlog/t", b"sentinel", 1)
        sentinel.disconnect()
        assert back.get().payload == b"sentinel"
        back.disconnect()


def test_messages_queued_for_an_away_session_do_not_grow_the_gateways_memory(tmp_path: Path) -> None:
    """100 x 1 MB acknowledged for an away durable session: the gateway's RSS grows by a small fraction
    of that (they are in broker.db; before, each was held twice in memory: +2 MB per MB queued)."""
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        assert gateway.process is not None
        process = psutil.Process(gateway.process.pid)
        subscribe_and_go_away(gateway.port, "away-big", "big", 1, clean_start=False, properties=EXPIRY)
        publisher = RawClient(gateway.port)
        publisher.connect("big-publisher")
        publisher.send(pk.Publish("big", b"warm-up", 1, packet_id=1000))
        publisher.expect(pk.PubAck)
        before = process.memory_info().rss
        megabyte = 1024 * 1024
        for index in range(100):
            publisher.send(pk.Publish("big", f"{index:03d}".encode().ljust(megabyte, b"."), 1, packet_id=index + 1))
            assert publisher.expect(pk.PubAck).reason_code == 0
        grown = process.memory_info().rss - before
        assert grown < 30 * megabyte, f"RSS grew {grown / megabyte:.0f} MB for 100 MB queued"
        publisher.close()
        back = RawClient(gateway.port)
        assert back.connect("away-big", clean_start=False, properties=EXPIRY).session_present
        payloads = []
        while len(payloads) < 101:
            packet = back.expect(pk.Publish)
            payloads.append(packet.payload[:7])
            back.send(pk.PubAck(packet.packet_id))
        assert payloads == [b"warm-up"] + [f"{index:03d}".encode().ljust(7, b".") for index in range(100)]
        back.close()


def test_max_queued_bytes_bounds_an_away_session_across_a_restart(tmp_path: Path) -> None:
    """Past ``max_queued_bytes`` an away durable session keeps the first messages (in the store, so they
    survive a restart) and drops the rest; MQTT 5 publishers hear 0x97, 3.1.1 ones cannot."""
    config = tmp_path / "gateway.toml"
    config.write_text("[broker.limits]\nmax_queued_bytes = 500\n")
    gateway = GatewayProcess(tmp_path / "data", config=config)
    with gateway:
        subscribe_and_go_away(gateway.port, "away", "queued", 1, level=pk.MQTT_311, clean_start=False)
        publisher = RawClient(gateway.port)
        publisher.connect("queue-publisher")
        for index in range(8):
            publisher.send(pk.Publish("queued", str(index).encode().ljust(100, b"."), 1, packet_id=index + 1))
        acks = [publisher.expect(pk.PubAck) for _ in range(8)]
        assert [(a.packet_id, a.reason_code) for a in acks] == [(i + 1, 0 if i < 5 else 0x97) for i in range(8)]
        publisher.close()
        assert gateway.terminate() == 0
        gateway.start()

        away = RawClient(gateway.port, level=4)
        assert away.connect("away", clean_start=False).session_present
        received: list[bytes] = []
        while len(received) < 5:
            packet = away.expect(pk.Publish)
            received.append(packet.payload[:1])
            away.send(pk.PubAck(packet.packet_id))
        away.send(pk.PingReq())
        assert isinstance(away.recv(), pk.PingResp)
        assert received == [str(index).encode() for index in range(5)]
        away.close()


def test_sigterm_publishes_every_will_before_disconnecting(tmp_path: Path) -> None:
    """Shutting down is the server closing the connections, so the wills are due (MQTT 5 3.1.2.5), the
    delayed one too, as mosquitto 2.0.11 does: a connected subscriber gets them before its DISCONNECT
    0x8B, a durable one finds them queued after the restart, and a retained will is retained."""
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        subscribe_and_go_away(gateway.port, "will-durable", "status/#", 1, level=pk.MQTT_311, clean_start=False)
        live = RawClient(gateway.port)
        live.connect("will-live")
        live.subscribe("status/#", 1)
        plain = RawClient(gateway.port, level=4)
        plain.connect("plain", will=pk.Will("status/plain", b"gone", 1, retain=True))
        delayed = RawClient(gateway.port)
        delayed.connect("delayed", will=pk.Will("status/delayed", b"gone later", 1,
                                                properties={pr.WILL_DELAY_INTERVAL: 600}),
                        properties={pr.SESSION_EXPIRY_INTERVAL: 3600})
        for client in (plain, delayed):
            client.send(pk.PingReq())
            client.expect(pk.PingResp)

        assert gateway.terminate() == 0
        seen = live.expect_closed()
        assert isinstance(seen[-1], pk.Disconnect) and seen[-1].reason_code == 0x8B
        assert sorted((p.topic, p.payload) for p in seen[:-1]) == [
            ("status/delayed", b"gone later"), ("status/plain", b"gone")]
        for client in (live, plain, delayed):
            client.close()

        gateway.start()
        durable = RawClient(gateway.port, level=4)
        assert durable.connect("will-durable", clean_start=False).session_present
        wills = sorted((durable.expect(pk.Publish).topic) for _ in range(2))
        assert wills == ["status/delayed", "status/plain"]
        durable.close()
        fresh = RawClient(gateway.port)
        fresh.connect("will-fresh")
        fresh.subscribe("status/#", 1)
        retained = fresh.expect(pk.Publish)
        assert (retained.topic, retained.payload, retained.retain) == ("status/plain", b"gone", True)
        fresh.close()


# -- wills waiting out their delay while the gateway is down -------------------------------------------

CLOCK_TOLERANCE = 0.1  # seconds: the test's and the gateway's time.time() are read at different moments
#: Wills due while the gateway was down go out at its restart (3 ms after it was ready, quiet), less what its
#: loop and the reader waited for a CPU (``run_queue``). A will whose 1 s delay restarted when the gateway read
#: its store came 0.98 s after it was ready (its start took the rest), which a bound of 1 s let pass.
WILLS_AT_RESTART_S = 0.5


def leave_abruptly_with_delayed_will(gateway: GatewayProcess, client_id: str, delay: int, expiry: int) -> float:
    """A real paho v5 client with a will (``delay`` s) drops its connection without DISCONNECT. Returns
    once broker.db records the client as away with its will still pending (so a kill -9 after this
    tests the restart, not a race with the commit), with the disconnect time recorded there: the
    moment the will delay counts from (wall clock, like the tests' ``time.time()``)."""
    device = PahoClient(gateway.port, client_id)
    properties = Properties(PacketTypes.WILLMESSAGE)
    properties.WillDelayInterval = delay
    device.client.will_set(f"status/{client_id}", b"offline", 1, properties=properties)
    device.connect(session_expiry=expiry)
    device.stop()
    database = f"file:{gateway.data_dir / 'broker.db'}?mode=ro"
    recorded: list[float] = []

    def away_with_will() -> bool:
        with closing(sqlite3.connect(database, uri=True)) as db:
            row = db.execute("SELECT disconnected_at, will_topic FROM sessions WHERE client_id = ?",
                             (client_id,)).fetchone()
        if row is None or None in row:
            return False
        recorded.append(float(row[0]))
        return True

    wait_until(away_with_will, timeout=10, what=f"broker.db recording {client_id} as away with its will")
    return recorded[0]


def durable_watcher(port: int, clean_start: bool = True) -> RawClient:
    watcher = RawClient(port)
    watcher.connect("will-watcher", clean_start=clean_start, properties=EXPIRY)
    if clean_start:
        watcher.subscribe("status/#", 1)
    return watcher


def test_a_delayed_will_pending_at_kill9_is_published_when_its_delay_ends(tmp_path: Path) -> None:
    """MQTT 5 only (the Will Delay Interval). MQTT 5 3.1.3.2.2: the will goes out when the delay ends,
    counted from the client's disconnect, not from the restart, and not at once either. A client that
    comes back in time cancels it: that is tested across a restart on the fake clock (test_timing.py)."""
    delay = 4
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        watcher = durable_watcher(gateway.port)
        left_at = leave_abruptly_with_delayed_will(gateway, "delayed", delay, expiry=60)
        gateway.kill9()
        assert time.time() < left_at + delay, "the machine was too slow: the delay ended before the kill"
        watcher.close()
        gateway.start()
        watcher = durable_watcher(gateway.port, clean_start=False)
        will = watcher.expect(pk.Publish, timeout=delay + 5)
        received_at = time.time()
        assert (will.topic, will.payload) == ("status/delayed", b"offline")
        assert received_at >= left_at + delay - CLOCK_TOLERANCE
        watcher.close()


def test_wills_due_while_the_gateway_was_down_are_published_at_restart_and_only_once(tmp_path: Path) -> None:
    """MQTT 5 only (will delay, session expiry). One will whose delay ended while the gateway was down, one whose session expired meanwhile
    (MQTT 5 3.1.3.2.2: the session ending publishes the will, and the session is gone); both go out
    at the restart, and a further restart does not publish them again."""
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        watcher = durable_watcher(gateway.port)
        watcher.send(pk.Disconnect())
        watcher.expect_closed()
        short_delay = leave_abruptly_with_delayed_will(gateway, "short-delay", delay=1, expiry=60)
        short_expiry = leave_abruptly_with_delayed_will(gateway, "short-expiry", delay=600, expiry=2)
        gateway.kill9()
        # The gateway is down: time passing is what this test is about, nothing to wait on.
        time.sleep(max(0.0, max(short_delay + 1, short_expiry + 2) + CLOCK_TOLERANCE - time.time()))
        gateway.start()
        assert gateway.process is not None
        # Its main thread runs the loop; this thread reads the wills. The time either waited for a CPU is the
        # machine's load (a CI host at load 9 on 2 cores), not a wait in the broker: a will waiting out its
        # delay (1 s) or its session's expiry (2 s) again from the restart is asleep, not waiting for a CPU.
        with run_queue.sampling(gateway.process.pid) as gateway_waits, \
                run_queue.sampling(os.getpid(), threading.get_native_id()) as own_waits:
            restarted_at = time.time()
            watcher = durable_watcher(gateway.port, clean_start=False)
            wills = [watcher.expect(pk.Publish) for _ in range(2)]
            published_at = time.time()
        load = gateway_waits.between(restarted_at, published_at) + own_waits.between(restarted_at, published_at)
        assert published_at - restarted_at - load < WILLS_AT_RESTART_S, (
            f"the wills waited for something after the restart: {published_at - restarted_at:.3f} s, "
            f"{load:.3f} s of it waiting for a CPU")
        assert sorted((will.topic, will.payload) for will in wills) == [
            ("status/short-delay", b"offline"), ("status/short-expiry", b"offline")]
        for will in wills:
            watcher.send(pk.PubAck(will.packet_id))
        watcher.send(pk.PingReq())
        watcher.expect(pk.PingResp)  # the acknowledgements are committed by now
        expired = RawClient(gateway.port)
        assert not expired.connect("short-expiry", clean_start=False, properties=EXPIRY).session_present
        expired.send(pk.Disconnect())
        expired.expect_closed()

        gateway.kill9()
        watcher.close()
        gateway.start()
        watcher = durable_watcher(gateway.port, clean_start=False)
        watcher.send(pk.PingReq())
        assert isinstance(watcher.recv(), pk.PingResp), "a will was published a second time"
        watcher.close()


def test_a_backlog_read_back_across_kill9_is_delivered_in_order_and_never_twice_as_new(tmp_path: Path) -> None:
    """kill -9 while an away session's backlog is being read back: after the restart the rest follows in
    order; a message is only repeated as the DUP resend of one that was in flight, never as a new one.
    MQTT 5 here (its Receive Maximum sets the window at the kill); the 3.1.1 backlogs are the two above."""
    gateway = GatewayProcess(tmp_path / "data")
    with gateway:
        subscribe_and_go_away(gateway.port, "drain", "drain/#", 1, clean_start=False, properties=EXPIRY)
        publisher = RawClient(gateway.port)
        publisher.connect("drain-publisher")
        for start in range(0, 1500, 100):
            publisher.sock.sendall(b"".join(
                encode(pk.Publish("drain/t", f"{index:05d}".encode(), 1, packet_id=index + 1), 5)
                for index in range(start, start + 100)))
            for _ in range(100):
                assert publisher.expect(pk.PubAck).reason_code == 0
        publisher.close()

        back = RawClient(gateway.port)
        back.connect("drain", clean_start=False, properties={**EXPIRY, pr.RECEIVE_MAXIMUM: 10})
        received: list[pk.Publish] = []
        while len(received) < 400:
            packet = back.expect(pk.Publish)
            received.append(packet)
            if len(received) < 395:  # the last few stay unacknowledged: in flight at the kill
                back.send(pk.PubAck(packet.packet_id))
        gateway.kill9()
        back.close()
        gateway.start()

        back = RawClient(gateway.port)
        assert back.connect("drain", clean_start=False, properties=EXPIRY).session_present
        while len({packet.payload for packet in received}) < 1500:
            packet = back.expect(pk.Publish)
            received.append(packet)
            back.send(pk.PubAck(packet.packet_id))
        # Whatever the broker still had to send (in answer to those PUBACKs or not) comes before PINGRESP.
        back.send(pk.PingReq())
        while not isinstance(packet := back.recv(), pk.PingResp):
            assert isinstance(packet, pk.Publish)
            received.append(packet)
            back.send(pk.PubAck(packet.packet_id))
        back.close()
    seen: list[bytes] = []
    for packet in received:
        if packet.payload in seen:
            assert packet.dup, f"{packet.payload!r} delivered twice as a new message"
            continue
        seen.append(packet.payload)
    assert seen == [f"{index:05d}".encode() for index in range(1500)]
