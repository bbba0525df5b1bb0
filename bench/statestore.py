"""Benchmark the state store against a plain QoS 1 request/response echo through the same broker.

    .venv/bin/python bench/statestore.py                  # 20,000 ops per run, 100,000 keys for RSS/restart
    .venv/bin/python bench/statestore.py --quick          # small counts
    .venv/bin/python bench/statestore.py --sync full      # the gateway with [statestore] sync = "full"

What it prints (issue 3, "Benchmark"):

* pipelined SET and GET (1 and 8 clients, each keeping ``--window`` requests in flight): ops/s, p50/p99;
* blocking SET and GET with ``StateStoreClient`` (one request at a time): p50/p99 round trip;
* the same load as a QoS 1 request/response *echo*: a responder client subscribed to a topic republishes
  each request to its Response Topic with its Correlation Data. Both use the identical requester code, so
  ``ratio = echo ops/s / store ops/s`` is the store's own cost (target: <= 1.20);
* gateway RSS after loading ``--keys`` keys of 100 bytes (target: < 60 MB);
* time from process start to ``appliance ready`` with those keys on disk (target: < 2 s).

The echo responder is a Python client on its own connection, so the echo path has one more network hop
and one more Python process than the store path; the ratio is therefore, if anything, kind to the echo.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

if __package__ in (None, ""):  # run by path: make ``appliance`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.statestore.client import StateStoreClient  # noqa: E402
from appliance.statestore.commands import GetCommand, SetCommand  # noqa: E402
from appliance.statestore.hlc import Hlc  # noqa: E402
from appliance.statestore.protocol import REQUEST_TOPIC  # noqa: E402
from testing.processes import GatewayProcess  # noqa: E402
from testing.waiting import wait_on  # noqa: E402

ECHO_TOPIC = "bench/echo/request"
VALUE = b"x" * 100


@dataclass
class RunResult:
    ops: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rate(self) -> float:
        return self.ops / self.seconds

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def connect(host: str, port: int, client_id: str) -> tuple[mqtt.Client, threading.Event]:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    ready = threading.Event()
    client.on_connect = lambda *args: ready.set()
    client.max_inflight_messages_set(1000)
    client.connect(host, port, keepalive=60)
    client.loop_start()
    if not ready.wait(10):
        raise TimeoutError("no CONNACK")
    return client, ready


def subscribe(client: mqtt.Client, topic: str) -> None:
    done = threading.Event()
    client.on_subscribe = lambda *args: done.set()
    client.subscribe(topic, qos=1)
    if not done.wait(10):
        raise TimeoutError("no SUBACK")


class Requester:
    """Keeps ``window`` requests in flight on one connection; records each one's round trip."""

    def __init__(self, host: str, port: int, topic: str, window: int) -> None:
        self.client_id = f"bench-{uuid.uuid4().hex[:10]}"
        self.client, _ = connect(host, port, self.client_id)
        self.topic = topic
        self.response_topic = f"clients/{self.client_id}/response"
        self.slots = threading.Semaphore(window)
        self.sent_at: dict[bytes, float] = {}
        self.latencies: list[float] = []
        self.lock = threading.Condition()  # notified on every response
        self.client.on_message = self.on_message
        subscribe(self.client, self.response_topic)

    def on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        correlation = message.properties.CorrelationData
        now = time.perf_counter()
        with self.lock:
            started = self.sent_at.pop(correlation)
            self.latencies.append((now - started) * 1000)
            self.lock.notify_all()
        self.slots.release()

    def run(self, payloads: list[bytes]) -> None:
        for index, payload in enumerate(payloads):
            self.slots.acquire()
            properties = Properties(PacketTypes.PUBLISH)
            properties.ResponseTopic = self.response_topic
            correlation = index.to_bytes(8, "big")
            properties.CorrelationData = correlation
            properties.UserProperty = [("__ts", str(Hlc(time.time_ns() // 1_000_000, 0, self.client_id)))]
            with self.lock:
                self.sent_at[correlation] = time.perf_counter()
            self.client.publish(self.topic, payload, qos=1, properties=properties)
        wait_on(self.lock, lambda: not self.sent_at, 60, lambda: f"{len(self.sent_at)} missing responses")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def start_echo(host: str, port: int) -> mqtt.Client:
    responder, _ = connect(host, port, f"echo-{uuid.uuid4().hex[:8]}")

    def echo(client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        properties = Properties(PacketTypes.PUBLISH)
        properties.CorrelationData = message.properties.CorrelationData
        properties.UserProperty = [("__stat", "200")]
        client.publish(message.properties.ResponseTopic, b"+OK\r\n", qos=1, properties=properties)

    responder.on_message = echo
    subscribe(responder, ECHO_TOPIC)
    return responder


def measure(host: str, port: int, topic: str, clients: int, payloads_for: list[list[bytes]], window: int) -> RunResult:
    requesters = [Requester(host, port, topic, window) for _ in range(clients)]
    threads = [threading.Thread(target=r.run, args=(p,)) for r, p in zip(requesters, payloads_for, strict=True)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    for requester in requesters:
        requester.close()
    latencies = [latency for requester in requesters for latency in requester.latencies]
    return RunResult(len(latencies), seconds, latencies)


def report(name: str, store: RunResult, echo: RunResult) -> None:
    ratio = echo.rate / store.rate
    print(
        f"{name:<14} store {store.rate:8.0f} ops/s p50 {store.percentile(0.5):6.2f} ms p99 {store.percentile(0.99):6.2f} ms"
        f" | echo {echo.rate:8.0f} ops/s p50 {echo.percentile(0.5):6.2f} ms p99 {echo.percentile(0.99):6.2f} ms"
        f" | cost ratio {ratio:4.2f} {'ok' if ratio <= 1.2 else 'OVER 1.20'}"
    )


def blocking_round_trips(host: str, port: int, count: int) -> None:
    """One request at a time through the client library: what an application sees per call."""
    with StateStoreClient(host, port) as client:
        for name, call in (("SET", lambda i: client.set(b"blocking/%d" % (i % 100), VALUE)),
                           ("GET", lambda i: client.get(b"blocking/%d" % (i % 100)))):
            latencies = []
            for i in range(count):
                started = time.perf_counter()
                call(i)
                latencies.append((time.perf_counter() - started) * 1000)
            result = RunResult(count, sum(latencies) / 1000, latencies)
            print(f"blocking {name:<5} {result.rate:8.0f} ops/s p50 {result.percentile(0.5):6.2f} ms"
                  f" p99 {result.percentile(0.99):6.2f} ms")


def load_keys(host: str, port: int, count: int, window: int) -> None:
    per_client = [[SetCommand(b"load/%d/%d" % (c, i), VALUE).encode() for i in range(count // 8)] for c in range(8)]
    measure(host, port, REQUEST_TOPIC, 8, per_client, window)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20_000, help="requests per run (split over the clients)")
    parser.add_argument("--keys", type=int, default=100_000, help="keys loaded for the RSS and restart figures")
    parser.add_argument("--window", type=int, default=32, help="requests in flight per client")
    parser.add_argument("--sync", choices=("normal", "full"), default="normal", help="[statestore] sync level")
    parser.add_argument("--quick", action="store_true", help="2,000 ops and 10,000 keys")
    args = parser.parse_args()
    if args.quick:
        args.ops, args.keys = 2_000, 10_000
    with tempfile.TemporaryDirectory(prefix="bench-statestore-") as tmp:
        config = Path(tmp) / "gateway.toml"
        config.write_text(f'[statestore]\nsync = "{args.sync}"\n')
        gateway = GatewayProcess(Path(tmp) / "data", config=config)
        try:
            gateway.start()
            host, port = gateway.host, gateway.port
            print(f"sync = {args.sync!r}")
            blocking_round_trips(host, port, min(2_000, args.ops))
            echo = start_echo(host, port)
            for clients in (1, 8):
                per = args.ops // clients
                sets = [[SetCommand(b"bench/%d/%d" % (c, i % 1000), VALUE).encode() for i in range(per)] for c in range(clients)]
                gets = [[GetCommand(b"bench/%d/%d" % (c, i % 1000)).encode() for i in range(per)] for c in range(clients)]
                echoes = [[VALUE] * per for _ in range(clients)]
                echo_result = measure(host, port, ECHO_TOPIC, clients, echoes, args.window)
                report(f"SET x{clients}", measure(host, port, REQUEST_TOPIC, clients, sets, args.window), echo_result)
                report(f"GET x{clients}", measure(host, port, REQUEST_TOPIC, clients, gets, args.window), echo_result)
            echo.disconnect()
            echo.loop_stop()
            baseline = psutil.Process(gateway.process.pid).memory_info().rss  # type: ignore[union-attr]
            load_keys(host, port, args.keys, args.window)
            rss = psutil.Process(gateway.process.pid).memory_info().rss  # type: ignore[union-attr]
            print(f"RSS with {args.keys} keys of 100 B: {rss / 2**20:.1f} MB (before loading: {baseline / 2**20:.1f} MB)"
                  f" {'ok' if rss < 60 * 2**20 else 'OVER 60 MB'}")
            gateway.terminate()
            started = time.monotonic()
            gateway.start()
            ready = time.monotonic() - started
            print(f"restart to ready with {args.keys} keys: {ready:.2f} s {'ok' if ready < 2 else 'OVER 2 s'}")
        finally:
            gateway.kill9()
    return 0


if __name__ == "__main__":
    sys.exit(main())
