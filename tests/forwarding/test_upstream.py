"""The upstream bridge against a real mosquitto, through the HIL rig's throttling relay."""

from __future__ import annotations

import asyncio
import gc
import getpass
import logging
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from appliance.forwarding.batch import decode_batch
from appliance.forwarding.config import DEFAULT_TOPIC_TEMPLATE, UpstreamConfig
from appliance.forwarding.messages import Message
from appliance.forwarding.metrics import ForwardingMetrics, LinkStats
from appliance.forwarding.pump import Pump
from appliance.forwarding.queues import MessageStore, QueuedMessage
from appliance.forwarding.routes import Endpoint, RouteResult
from appliance.forwarding.upstream import UpstreamSender
from appliance.store_thread import StoreThread
from hil_tests.rig.relay import RelayThread
from testing import waiting
from testing.collector import Collector
from testing.fake_runtime import FakeRuntime
from testing.processes import MosquittoProcess, free_port
from tests.forwarding.peers import batch_records

UP = Endpoint("upstream")


def msg(n: int, size: int = 50) -> Message:
    return Message("/messages/events", "devices/t1/messages/events/data", b"p" * size, "t1", None, "data",
                   [("n", str(n))], "application/json")


def run_bridge(tmp_path: Path, port: int, protocol: str, scenario: Callable[..., Awaitable[None]],
               topic_template: str = DEFAULT_TOPIC_TEMPLATE, fake_clock: bool = False,
               **settings: Any) -> tuple[UpstreamSender, ForwardingMetrics]:
    """``fake_clock``: the bridge and the pump on a ``FakeRuntime`` (``pump.runtime``), which the scenario
    moves; the sockets stay real."""
    settings = {"keepalive_s": 2, **settings}
    upstream = UpstreamConfig(host="127.0.0.1", port=port, protocol=protocol, backoff_min_s=0.05, backoff_max_s=0.2,
                              topic_template=topic_template, **settings)
    metrics = ForwardingMetrics()

    async def main() -> UpstreamSender:
        thread = StoreThread("test-store")
        store = MessageStore(tmp_path / "forwarding.db")
        runtime = FakeRuntime.on_running_loop() if fake_clock else None
        sender = UpstreamSender(upstream, "gw1", metrics.links.setdefault("upstream", LinkStats()), runtime)
        pump = Pump(sender, store, thread, metrics, retry_min_s=0.01, retry_max_s=0.1, runtime=runtime)

        async def add(n: int, priority: int = 0, size: int = 50) -> None:
            await thread.call(store.add, msg(n, size), [RouteResult(UP, priority, 60)])
            pump.notify(priority)

        sender.start()
        pump.start()
        try:
            await scenario(add, pump, store, thread)
        finally:
            assert pump.task is not None
            pump.stop()
            await asyncio.gather(pump.task, return_exceptions=True)
            await sender.stop()
            await thread.call(store.close)
            thread.shutdown()
        return sender

    return asyncio.run(main()), metrics


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_bridge_delivers_with_qos1_and_identity(tmp_path: Path, mosquitto: MosquittoProcess, protocol: str) -> None:
    with Collector(mosquitto.host, mosquitto.port, "gateways/#") as collector:
        run_bridge(tmp_path, mosquitto.port, protocol, sending(5, 10))
        received = collector.wait_for(5)
    assert {r.topic for r in received} == {"gateways/gw1/devices/t1/messages/events"}
    if protocol == "5":
        assert sorted(r.n for r in received) == list(range(5))
        first = received[0].user_properties
        assert first["gw-gateway-id"] == "gw1" and first["gw-device-id"] == "t1" and first["gw-output"] == "data"
        assert first["gw-message-id"].startswith("gw1:") and first["gw-priority"] == "0" and first["gw-ttl-s"] == "60"
        assert len({r.user_properties["gw-message-id"] for r in received}) == 5


def test_over_mqtt_311_the_identity_travels_in_the_topic(tmp_path: Path, mosquitto: MosquittoProcess) -> None:
    """MQTT 3.1.1 has no user properties; ``{message_id}`` and ``{priority}`` in the template carry them."""
    with Collector(mosquitto.host, mosquitto.port, "gateways/#") as collector:
        async def scenario(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
            await add(0, priority=0)
            await add(1, priority=3)
            await until_empty(store, thread, 10)

        run_bridge(tmp_path, mosquitto.port, "3.1.1", scenario,
                   topic_template="gateways/{gateway_id}/devices/{device_id}/p{priority}/{message_id}")
        received = collector.wait_for(2)
    topics = sorted(r.topic for r in received)
    assert [t.rpartition(":")[0] for t in topics] == ["gateways/gw1/devices/t1/p0/gw1", "gateways/gw1/devices/t1/p3/gw1"]
    first, second = (int(t.rpartition(":")[2]) for t in topics)
    assert second == first + 1, topics
    assert all(r.user_properties == {} for r in received)


async def _until(predicate: Callable[[], bool], thread: StoreThread) -> None:
    """Re-check a store predicate after every store call the pump makes (the store thread is the event source)."""
    while not await thread.call(predicate):
        await asyncio.sleep(0.01)


async def until_empty(store: MessageStore, thread: StoreThread, timeout_s: float) -> None:
    """Until ``store`` holds no message (each one acknowledged upstream or dead-lettered), ``timeout_s`` at most."""
    await asyncio.wait_for(_until(lambda: store.message_count() == 0, thread), timeout_s)


def sending(count: int, timeout_s: float, **add_options: int) -> Callable[..., Awaitable[None]]:
    """A ``run_bridge`` scenario: messages 0 to ``count`` - 1 added (``add_options``: their priority or size),
    then ``until_empty``."""
    async def scenario(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
        for n in range(count):
            await add(n, **add_options)
        await until_empty(store, thread, timeout_s)

    return scenario


def test_outage_keeps_messages_queued_then_reconnects(tmp_path: Path, mosquitto: MosquittoProcess, relay: RelayThread) -> None:
    with Collector(mosquitto.host, mosquitto.port, "gateways/#") as collector:
        async def scenario(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
            await add(0)
            await asyncio.wait_for(pump.wait_batches(1), 10)
            relay.cut()
            relay.set(up=False)
            for n in range(1, 4):
                await add(n)
            # The outage lasts until the bridge has tried three times more and been refused each time (the
            # relay counts refusals): by then the messages had every chance to leave, and none may have.
            refused = relay.stats().connections_refused
            await waiting.until(lambda: relay.stats().connections_refused >= refused + 3, 10, "three refused attempts")
            assert await thread.call(store.message_count) == 3
            relay.set(up=True)
            await until_empty(store, thread, 15)

        sender, _ = run_bridge(tmp_path, relay.port, "5", scenario)
        received = collector.wait_for(4)
    assert sorted({r.n for r in received}) == [0, 1, 2, 3]
    assert sender.connects >= 2


def test_window_follows_the_measured_link(tmp_path: Path, mosquitto: MosquittoProcess, relay: RelayThread) -> None:
    relay.set(rate_bps=9600, delay_ms=20)  # 40 ms round trip

    slow, _ = run_bridge(tmp_path, relay.port, "5", sending(20, 30, size=100))
    assert slow.estimate.rate_bytes_per_s is not None
    # 9.6 kbit/s is 1200 B/s on the wire, TCP/IP headers included; the token bucket's burst allowance
    # makes the first batches look faster, which the smoothing must have mostly forgotten.
    assert 600 < slow.estimate.rate_bytes_per_s < 1800, slow.estimate.rate_bytes_per_s
    assert slow.estimate.window().messages <= 3, "a couple of messages per batch on a satellite link"

    # No rate limit and a long round trip (a broadband satellite link): the window must cover the round
    # trip. Without a rate limit the bottleneck is the CPU of the relay, mosquitto and the sender (a
    # fresh clone's make test measured 15.8 kB/s at load 4, hundreds of kB/s quiet), so the round trip is
    # what makes the product large: 9 x 0.2 s x 5 kB/s (a machine loaded past that) / ~400 B is 22.
    relay.set(rate_bps=0, delay_ms=100)
    (tmp_path / "fast").mkdir()
    fast, _ = run_bridge(tmp_path / "fast", relay.port, "5", sending(300, 30, size=100))
    assert slow.estimate.target_messages() <= 2, "nine bandwidth-delay products are at most two messages"
    assert fast.estimate.target_messages() > 20, (fast.estimate.rate_bytes_per_s, fast.estimate.rtt_s)


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_batch_format_packs_messages_with_their_identity(tmp_path: Path, mosquitto: MosquittoProcess, protocol: str) -> None:
    """Over either protocol version the batch carries the whole identity (3.1.1 has no user properties)."""
    with Collector(mosquitto.host, mosquitto.port, "gateways/#") as collector:
        sender, metrics = run_bridge(tmp_path, mosquitto.port, protocol, sending(30, 10, priority=4), format="batch")
        records = batch_records(collector, 30)
    publishes = list(collector.messages)
    assert {r.topic for r in publishes} == {"gateways/gw1/batches"}
    assert all(r.user_properties == {} for r in publishes)
    # 512 bytes of payload per PUBLISH before the link is measured: ten 50-byte messages at most.
    assert 3 <= len(publishes) < 30
    assert [int(dict(r.source.properties)["n"]) for r in records] == list(range(30))
    first = records[0]
    assert first.message_id.startswith("gw1:") and first.source.device_id == "t1" and first.source.output == "data"
    assert first.source.ttl_s == 60 and first.source.content_type == "application/json" and first.payload == b"p" * 50
    assert len({r.message_id for r in records}) == 30
    assert metrics.counters["sent"][("upstream", 4)] == 30


def test_batches_never_mix_priorities_and_the_highest_goes_first(tmp_path: Path, mosquitto: MosquittoProcess, relay: RelayThread) -> None:
    with Collector(mosquitto.host, mosquitto.port, "gateways/#") as collector:
        async def scenario(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
            await add(-1, priority=0)
            await asyncio.wait_for(pump.wait_batches(1), 10)
            relay.cut()
            relay.set(up=False)
            for n in range(10):
                await add(n, priority=5 if n % 2 else 1)
            relay.set(up=True)
            await until_empty(store, thread, 15)

        run_bridge(tmp_path, relay.port, "5", scenario, format="batch")
        batch_records(collector, 11)
    batches = [decode_batch(r.payload) for r in collector.messages]
    assert [b.priority for b in batches] == sorted(b.priority for b in batches), "P0, then P1, then P5"
    expected_parity = {0: {-1}, 1: {0}, 5: {1}}  # n = -1 is the P0 alert; even n went in at P1, odd at P5
    for batch in batches:
        ns = {int(dict(r.source.properties)["n"]) for r in batch.records}
        assert {n if n < 0 else n % 2 for n in ns} == expected_parity[batch.priority]


def test_batches_respect_the_upstream_maximum_packet_size(tmp_path: Path) -> None:
    """mosquitto announces ``max_packet_size`` in its CONNACK; a batch bigger than that would close the link."""
    with (MosquittoProcess(tmp_path / "small", extra_config="max_packet_size 1024\n") as small,
          Collector(small.host, small.port, "gateways/#") as collector):
        sender, _ = run_bridge(tmp_path, small.port, "5", sending(40, 15, size=100), format="batch", batch_max_bytes=8192)
        batch_records(collector, 40)
    assert sender.connects == 1, "never disconnected for an oversized packet"
    assert max(len(r.payload) for r in collector.messages) <= 1024


def test_never_more_in_flight_than_the_upstreams_receive_maximum(tmp_path: Path) -> None:
    """MQTT 5 section 3.3.4: a client MUST NOT have more unacknowledged QoS 1 PUBLISHes than the server's
    Receive Maximum (CONNACK); a server that enforces it closes the connection (0x93), and the pump then
    blames an innocent message at the head of the queue for the drop. Before: the window alone bounded
    what was in flight (up to 200 on a fast link), whatever the server announced. mosquitto announces
    ``max_inflight_messages`` as its Receive Maximum (it does not enforce it, so the count is taken here)."""
    with (MosquittoProcess(tmp_path / "strict", extra_config="max_inflight_messages 2\n") as strict,
          RelayThread(strict.host, strict.port) as slow):
        slow.set(delay_ms=30)  # acks come late, so a window above 2 would put more than 2 in flight
        most = 0

        async def scenario(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
            nonlocal most
            for n in range(60):
                await add(n)
            while await thread.call(store.message_count):
                connection = pump.sender._connection  # paho's own count of unacknowledged PUBLISHes
                most = max(most, connection.client._inflight_messages if connection is not None else 0)
                await asyncio.sleep(0.002)

        sender, _ = run_bridge(tmp_path, slow.port, "5", scenario)
    assert sender.window().messages > 2, "the window alone would have allowed more"
    assert 1 <= most <= 2, most


def test_batch_window_follows_the_measured_link(tmp_path: Path, mosquitto: MosquittoProcess, relay: RelayThread) -> None:
    """At 9.6 kbit/s a batch PUBLISH is about half a second of link; the batch is two of them."""
    relay.set(rate_bps=9600, delay_ms=20)

    slow, _ = run_bridge(tmp_path, relay.port, "5", sending(60, 60, size=100), format="batch")
    assert slow.estimate.rate_bytes_per_s is not None and 600 < slow.estimate.rate_bytes_per_s < 1800, slow.estimate.rate_bytes_per_s
    window = slow.window()
    assert window.chunk_bytes is not None and window.bytes is not None
    assert abs(window.chunk_bytes - slow.estimate.rate_bytes_per_s / 2) <= 1
    assert window.bytes >= 2 * window.chunk_bytes


def test_bridge_over_tls_verifies_the_cloud_and_delivers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """TLS on the event loop: the handshake without blocking it, records larger than one read, and a
    certificate that does not match is refused (no connection, messages stay queued)."""
    # mosquitto drops root privileges before it reads its certificate: not from pytest's private tmp dir.
    readable = Path(tempfile.mkdtemp(prefix="upstream-tls-"))
    readable.chmod(0o755)
    cert, key = readable / "cert.pem", readable / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    key.chmod(0o644)
    tls_port = free_port()
    with MosquittoProcess(tmp_path / "cloud", extra_config=f"listener {tls_port} 127.0.0.1\ncertfile {cert}\nkeyfile {key}\n") as cloud:
        with Collector(cloud.host, cloud.port, "gateways/#") as collector:
            sender, _ = run_bridge(tmp_path, tls_port, "5", sending(20, 15, size=6000), tls=True, ca_file=cert)
            received = collector.wait_for(20)
        assert sender.connects == 1
        assert sorted(r.n for r in received) == list(range(20)) and all(r.payload == b"p" * 6000 for r in received)

        (tmp_path / "wrong").mkdir()

        async def refused(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
            await add(0)
            runtime = pump.runtime
            assert isinstance(runtime, FakeRuntime)
            # Each attempt's handshake fails for real; the backoff between them (up to its 0.2 s ceiling) is
            # on the fake clock: a second of it is several attempts at the ceiling.
            await runtime.run_until(lambda: runtime.time >= 1.0, within=1.2)
            assert await thread.call(store.message_count) == 1

        other = tmp_path / "other.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=other",
                        "-keyout", str(tmp_path / "other-key.pem"), "-out", str(other)], check=True, capture_output=True)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="appliance.forwarding.upstream"):
            untrusting, _ = run_bridge(tmp_path / "wrong", tls_port, "5", refused, tls=True, ca_file=other,
                                       fake_clock=True)
        assert untrusting.connects == 0
        failures = [r for r in caplog.records if "connect failed" in r.getMessage()]
        assert len(failures) >= 6, [r.getMessage() for r in failures]  # 0.05, 0.1, then 0.2 s apart at most
        assert "certificate verify failed" in failures[0].getMessage()
    shutil.rmtree(readable)


def test_a_link_that_suddenly_gets_slow_is_not_taken_for_a_dead_one(
    tmp_path: Path, mosquitto: MosquittoProcess, relay: RelayThread
) -> None:
    """Keep-alive 1 s; the link drops from 2 Mbit/s to 9.6 kbit/s with a window sized for the fast link in
    flight (seconds of the slow link). PUBACKs keep coming, slowly: the bridge must keep its connection
    (paho's PINGREQ, queued behind that window, would time out and reconnect)."""
    relay.set(rate_bps=2_000_000, delay_ms=20)

    async def scenario(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
        relay.set(up=False)
        for n in range(1500):
            await add(n, size=200)
        relay.set(up=True)
        await asyncio.wait_for(pump.wait_batches(6), 20)  # the window has grown on the fast link
        relay.set(rate_bps=9600)
        await asyncio.sleep(5)  # five keep-alive periods on the slow link
        relay.set(rate_bps=0)
        await until_empty(store, thread, 60)

    sender, _ = run_bridge(tmp_path, relay.port, "5", scenario, keepalive_s=1)
    assert sender.connects == 1, "the slow link was taken for a dead one"


@pytest.mark.parametrize("upstream_format", ["message", "batch"])
def test_a_message_expired_by_its_turn_is_never_published_and_counts_as_done(tmp_path: Path, mosquitto: MosquittoProcess,
                                                                              upstream_format: str) -> None:
    """Expiry is judged when each PUBLISH is handed to the link, not when the pump read the batch: on a slow
    link a batch can outlast a message's TTL while it waits for the window (seen in the HIL outage scenario
    as ``gw-sent-ms`` past ``gw-enqueued-ms + gw-ttl-s``)."""
    collector = Collector(mosquitto.host, mosquitto.port, "gateways/#")
    upstream = UpstreamConfig(host="127.0.0.1", port=mosquitto.port, protocol="5", backoff_min_s=0.05, backoff_max_s=0.2,
                              keepalive_s=2, format=upstream_format)
    sender = UpstreamSender(upstream, "gw1", LinkStats())
    now_ms = int(time.time() * 1000)

    def queued(seq: int, expires_ms: int) -> QueuedMessage:
        return QueuedMessage(seq, "upstream", 0, now_ms - 1000, 1, expires_ms, msg(seq))

    # expired, live, expired, expired, live, expired: the middle run and the tail are done without a PUBLISH
    batch = [queued(1, now_ms - 1), queued(2, now_ms + 60_000), queued(3, now_ms - 1), queued(4, now_ms - 1),
             queued(5, now_ms + 60_000), queued(6, now_ms - 1)]

    async def main() -> int:
        sender.start()
        try:
            await asyncio.wait_for(sender.wait_ready(), 10)
            return await sender.send(batch, asyncio.Event())
        finally:
            await sender.stop()

    try:
        done = asyncio.run(main())
        # Everything the sender published was acknowledged, so mosquitto routed it before this marker.
        subprocess.run(["mosquitto_pub", "-h", mosquitto.host, "-p", str(mosquitto.port), "-q", "1",
                        "-t", "gateways/marker", "-m", "end"], check=True, timeout=10)
        collector.wait_for_topic("gateways/marker")
    finally:
        collector.close()
    assert done == len(batch)
    data = [m for m in collector.messages if m.topic != "gateways/marker"]
    if upstream_format == "batch":
        sent = [record.seq for m in data for record in decode_batch(m.payload).records]
    else:
        sent = [int(m.user_properties["gw-message-id"].split(":")[1]) for m in data]
    assert sent == [2, 5]




def test_a_round_trip_longer_than_the_keepalive_is_a_slow_link_not_a_dead_one(
    tmp_path: Path, mosquitto: MosquittoProcess, relay: RelayThread
) -> None:
    """Keep-alive 2 s over a link with a 2.4 s round trip: the CONNACK and every PINGRESP come later than
    one keep-alive period after the packet that asked for them. paho's rule (a reply within one period)
    closed every connection before its CONNACK, so nothing was ever delivered; now the CONNACK has
    ``CONNECT_TIMEOUT_S`` and an outstanding PINGREQ is data in flight, judged by liveness.py (1.5
    keep-alives plus the link's step)."""
    relay.set(delay_ms=1200)

    async def scenario(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
        await asyncio.wait_for(pump.sender.wait_ready(), 15)
        for n in range(3):
            await add(n)
        await until_empty(store, thread, 20)
        idle_until = time.monotonic() + 5  # PINGREQ/PINGRESP exchanges while idle
        await asyncio.wait_for(_until(lambda: time.monotonic() > idle_until, thread), 7)
        await add(3)
        await until_empty(store, thread, 20)

    sender, _ = run_bridge(tmp_path, relay.port, "5", scenario, keepalive_s=2)
    assert sender.connects == 1, "a long round trip was taken for a dead link"


async def _until_logged(caplog: pytest.LogCaptureFixture, text: str) -> None:
    await waiting.until(lambda: any(text in r.getMessage() for r in caplog.records), 10, f"a log line with {text!r}")


def test_cloud_connection_failures_are_warnings_with_the_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 24: a gateway that cannot reach or log in to its cloud says so at WARNING, with why."""
    passwords = tmp_path / "cloud.passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), "gw", "right"], check=True, capture_output=True)
    passwords.chmod(0o644)
    cloud_config = f"allow_anonymous false\npassword_file {passwords}\nuser {getpass.getuser()}\n"
    with MosquittoProcess(tmp_path / "cloud", extra_config=cloud_config) as cloud:
        async def scenario(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
            await _until_logged(caplog, "refused the connection")

        with caplog.at_level(logging.INFO, logger="appliance.forwarding.upstream"):
            run_bridge(tmp_path, cloud.port, "5", scenario, username="gw", password="wrong")
    [refused] = {r.getMessage(): r for r in caplog.records if "refused the connection" in r.getMessage()}.values()
    assert refused.levelno == logging.WARNING
    # mosquitto 2.0 answers a wrong password with 0x87 Not authorized (0x86 on other servers).
    assert re.search(r"refused the connection: .* \(0x8[67]\) for user 'gw'", refused.getMessage())
    caplog.clear()

    async def unreachable(add, pump: Pump, store: MessageStore, thread: StoreThread) -> None:
        await _until_logged(caplog, "connect failed")

    with caplog.at_level(logging.INFO, logger="appliance.forwarding.upstream"):
        run_bridge(tmp_path, free_port(), "5", unreachable)
    failed = next(r for r in caplog.records if "connect failed" in r.getMessage())
    assert failed.levelno == logging.WARNING and "Connection refused" in failed.getMessage()


def test_a_batch_given_up_while_its_acks_are_in_flight_leaves_no_unretrieved_failure(
    tmp_path: Path, mosquitto: MosquittoProcess, relay: RelayThread, caplog: pytest.LogCaptureFixture
) -> None:
    """A pump stopped (its task cancelled) while PUBACKs are in flight, then the connection lost: the
    futures of those PUBACKs used to be failed by the disconnect with nobody waiting for them, and asyncio
    logged "Future exception was never retrieved" at ERROR, once per PUBLISH, into whatever ran next."""
    upstream = UpstreamConfig(host=relay.host, port=relay.port, protocol="5", backoff_min_s=0.05, backoff_max_s=0.2,
                              keepalive_s=30)
    sender = UpstreamSender(upstream, "gw1", LinkStats())
    now_ms = int(time.time() * 1000)
    batch = [QueuedMessage(seq, "upstream", 0, now_ms, 1, now_ms + 60_000, msg(seq)) for seq in range(1, 5)]

    async def main() -> None:
        sender.start()
        await asyncio.wait_for(sender.wait_ready(), 10)
        relay.set(up=False)  # PUBLISHes go out, no PUBACK comes back
        sending = asyncio.ensure_future(sender.send(batch, asyncio.Event()))
        await waiting.until(lambda: bool(sender._pending), timeout=10, what="PUBLISHes in flight")
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        await sender.stop()  # the connection is lost with those PUBACKs outstanding

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    relay.set(up=True)
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
