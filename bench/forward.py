"""Benchmark store-and-forward (issue 4) next to mosquitto's bridge, and print a Markdown table.

    .venv/bin/python bench/forward.py                  # 100,000-message backlog, 60 s of alerts
    .venv/bin/python bench/forward.py --backlog 5000 --alerts 20

Setup: devices -> gateway (ours, or mosquitto with a ``connection`` bridge) -> the HIL rig's throttling
relay -> mosquitto as the cloud, where a collector subscribes to everything.

* ``ingest``: the link is down; one device publishes the backlog QoS 1 with 64 messages in flight;
  messages/s until the last PUBACK. Ours commits each message to SQLite (fsync) before its PUBACK;
  mosquitto (``persistence false``) only queues it in memory - the figures are not equally durable.
* ``ingest_devices``: the same with ``--devices`` devices publishing at once (each 64 in flight, the
  backlog split between them), measured last, on top of what the priority run left queued. The broker
  hands one client's publishes to the store one by one, so only many devices can share a group commit.
* ``drain``: the link comes up unthrottled; messages/s until the collector has the whole backlog.
* ``priority``: the backlog again (P9), the link at 64 kbit/s, then one P0 alert per second; P0 latency
  (device publish to collector) p50/p99, and how busy the link was: relay bytes over capacity, and the
  payload bytes that arrived over capacity (goodput). mosquitto's bridge has one FIFO queue, so its alerts
  wait for the whole backlog ahead of them: the run stops after the alerts plus 10 s and reports how many
  alerts arrived at all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.forwarding.batch import decode_batch  # noqa: E402
from hil_tests.rig.relay import RelayThread  # noqa: E402
from testing.collector import Collector  # noqa: E402
from testing.processes import GatewayProcess, MosquittoProcess  # noqa: E402
from testing.waiting import WaitTimeout  # noqa: E402

LINK_BPS = 64_000
#: mosquitto leaves Nagle on by default; with it every small PUBLISH can wait for a delayed ACK.
NODELAY = "set_tcp_nodelay true\n"
PAYLOAD = 200
QUEUED = 1024  # publishes handed to paho and not yet acknowledged


class Cloud(Collector[int]):
    """Counts what reaches the cloud broker and timestamps alerts: the suite's collector, subscribed to
    everything, keeping per PUBLISH only how many messages it carried (a drain is 100,000 of them)."""

    def __init__(self, host: str, port: int) -> None:
        self.count = 0
        self.payload_bytes = 0
        self.alerts: dict[int, float] = {}
        super().__init__(host, port, "#", client_id="bench-cloud", name="bench-cloud")

    def parse(self, message: mqtt.MQTTMessage, at: float) -> list[int]:
        """Counted here, on paho's thread, before the collector wakes its waiters."""
        if message.topic.endswith("/metrics"):
            return []
        if message.topic.endswith("/batches"):
            payloads = [record.payload for record in decode_batch(message.payload).records]
        else:
            payloads = [message.payload]
        for payload in payloads:
            if payload.startswith(b"ALERT"):
                self.alerts[int(payload.split(b":")[1])] = at
            else:
                self.count += 1
            self.payload_bytes += len(payload)
        return [len(payloads)]

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Whether ``predicate()`` came to hold within ``timeout`` (re-checked on every arrival)."""
        try:
            self.wait_until(predicate, timeout)
        except WaitTimeout:
            return False
        return True


class Publisher:
    def __init__(self, host: str, port: int, device_id: str = "t1") -> None:
        self.device_id = device_id
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=device_id, protocol=mqtt.MQTTv5)
        self.client.max_inflight_messages_set(64)
        self.done = threading.Event()
        self.acked = 0
        self.target = 0
        self.cond = threading.Condition()
        self.client.on_publish = self.on_publish
        self.client.connect(host, port)
        self.client.loop_start()

    def on_publish(self, client: mqtt.Client, userdata: object, mid: int, *rest: object) -> None:
        with self.cond:
            self.acked += 1
            self.cond.notify_all()
        if self.acked >= self.target:
            self.done.set()

    def publish(self, output: str, payload: bytes) -> int:
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "application/octet-stream"
        return self.client.publish(f"devices/{self.device_id}/messages/events/{output}", payload, qos=1, properties=props).mid

    def flood(self, count: int) -> float:
        """Publish ``count`` messages; seconds until the last PUBACK."""
        start = time.monotonic()
        self.done.clear()
        self.target = self.acked + count
        for n in range(count):
            # Keep paho's own queue short: it hands out packet ids when publish() is called, and with
            # more than 65,535 queued they repeat and acknowledgements go to the wrong message.
            with self.cond:
                self.cond.wait_for(lambda n=n: self.target - count + n - self.acked < QUEUED)
            self.publish("data", b"d" * PAYLOAD)
        if not self.done.wait(3600):
            raise TimeoutError("no PUBACK for the last message")
        return time.monotonic() - start

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def start_ours(stack: ExitStack, work: Path, relay: RelayThread, upstream_format: str) -> tuple[str, int]:
    (work / "manifest.json").write_text(json.dumps({"schemaVersion": "1.1.0", "routes": {
        "data": {"route": "FROM /messages/* WHERE $outputName = 'data' INTO $upstream", "priority": 9},
        "alerts": {"route": "FROM /messages/* WHERE $outputName = 'alerts' INTO $upstream", "priority": 0},
    }}))
    (work / "gw.toml").write_text(f"""[gateway]
id = "gw1"
[forwarding]
enabled = true
manifest = "manifest.json"
[forwarding.upstream]
host = "127.0.0.1"
port = {relay.port}
keepalive_s = 10
format = "{upstream_format}"
backoff_min_s = 0.1
backoff_max_s = 1
""")
    gateway = GatewayProcess(work / "data", config=work / "gw.toml")
    stack.callback(gateway.kill9)
    gateway.start()
    return gateway.host, gateway.port


def start_mosquitto_bridge(stack: ExitStack, work: Path, relay: RelayThread) -> tuple[str, int]:
    bridge = MosquittoProcess(work, extra_config=(
        NODELAY + "max_queued_messages 0\nmax_inflight_messages 64\n"
        f"connection cloud\naddress 127.0.0.1:{relay.port}\nbridge_protocol_version mqttv50\n"
        "topic # out 1 devices/ gateways/gw1/devices/\ncleansession false\nrestart_timeout 1\n"
    ))
    stack.enter_context(bridge)
    return bridge.host, bridge.port


def run(kind: str, backlog: int, alerts: int, drain_timeout: float, devices: int) -> dict[str, object]:
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Unlimited queues: mosquitto's default (1,000) would drop what the collector has not read yet.
        cloud_broker = stack.enter_context(MosquittoProcess(work / "cloud", extra_config=NODELAY + "max_queued_messages 0\n"))
        relay = RelayThread(cloud_broker.host, cloud_broker.port)
        relay.start()
        stack.callback(relay.stop)
        cloud = Cloud(cloud_broker.host, cloud_broker.port)
        stack.callback(cloud.close)
        host, port = KINDS[kind](stack, work, relay)
        device = Publisher(host, port)
        stack.callback(device.close)
        result: dict[str, object] = {}

        # Warm up: the bridge (either) has connected and holds a session before the link goes down.
        device.publish("alerts", b"ALERT:-1")
        if not cloud.wait(lambda: -1 in cloud.alerts, 30):
            raise TimeoutError("the upstream link never came up")
        relay.cut()
        relay.set(up=False)
        seconds = device.flood(backlog)
        result["ingest"] = backlog / seconds
        start = time.monotonic()
        relay.set(up=True)
        complete = cloud.wait(lambda: cloud.count >= backlog, drain_timeout)
        result["drain"] = cloud.count / (time.monotonic() - start)
        if not complete:
            result["drain_note"] = f"only {cloud.count}/{backlog} in {drain_timeout:.0f} s"
        cloud.count = 0

        # Priority: a new backlog behind a 64 kbit/s link, then one alert per second.
        relay.cut()
        relay.set(up=False)
        device.flood(backlog)
        relay.set(up=True, rate_bps=LINK_BPS)
        cloud.wait(lambda: cloud.count > 0, 30)  # reconnected: the backlog flows (the alerts measure priority, not backoff)
        stats_before, window_start, bytes_before = relay.stats(), time.monotonic(), cloud.payload_bytes
        sent_at: dict[int, float] = {}
        for n in range(alerts):
            sent_at[n] = time.monotonic()
            device.publish("alerts", f"ALERT:{n}".encode())
            time.sleep(max(0.0, window_start + n + 1 - time.monotonic()))
        cloud.wait(lambda: len(cloud.alerts) >= alerts + 1, 10)
        cloud.alerts.pop(-1, None)
        elapsed = time.monotonic() - window_start
        stats = relay.stats()
        link_bytes = stats.upstream.bytes_forwarded - stats_before.upstream.bytes_forwarded
        capacity = LINK_BPS / 8 * elapsed
        latencies = sorted(cloud.alerts[n] - sent_at[n] for n in cloud.alerts)
        result["alerts_arrived"] = f"{len(latencies)}/{alerts}"
        if latencies:
            result["p0_p50_ms"] = statistics.median(latencies) * 1000
            result["p0_p99_ms"] = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
        result["link_busy"] = link_bytes / capacity
        result["goodput"] = (cloud.payload_bytes - bytes_before) / capacity

        if devices > 1:
            relay.cut()
            relay.set(up=False)
            publishers = [Publisher(host, port, f"fan{n}") for n in range(devices)]
            for publisher in publishers:
                stack.callback(publisher.close)
            start = time.monotonic()
            threads = [threading.Thread(target=p.flood, args=(backlog // devices,)) for p in publishers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            result["ingest_devices"] = backlog // devices * devices / (time.monotonic() - start)
        return result


KINDS = {
    "ours-batch": lambda stack, work, relay: start_ours(stack, work, relay, "batch"),
    "ours-message": lambda stack, work, relay: start_ours(stack, work, relay, "message"),
    "mosquitto": start_mosquitto_bridge,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--alerts", type=int, default=60, help="seconds of one P0 alert per second")
    parser.add_argument("--drain-timeout", type=float, default=600)
    parser.add_argument("--brokers", default=",".join(KINDS), help=f"which to run, of {', '.join(KINDS)}")
    parser.add_argument("--devices", type=int, default=16, help="devices publishing at once for ingest_devices (1 = skip)")
    args = parser.parse_args()
    kinds = args.brokers.split(",")
    rows: dict[str, dict[str, object]] = {}
    for kind in kinds:
        rows[kind] = run(kind, args.backlog, args.alerts, args.drain_timeout, args.devices)
        print(kind, rows[kind], flush=True)
    print(f"backlog {args.backlog} x {PAYLOAD} B, link {LINK_BPS // 1000} kbit/s for the priority run\n")
    print("| figure | " + " | ".join(kinds) + " |\n|---|" + "---|" * len(kinds))
    for key, unit in (("ingest", "msg/s"), ("ingest_devices", "msg/s"), ("drain", "msg/s"), ("drain_note", ""), ("alerts_arrived", ""),
                      ("p0_p50_ms", "ms"), ("p0_p99_ms", "ms"), ("link_busy", ""), ("goodput", "")):
        cells = []
        for kind in kinds:
            value = rows[kind].get(key, "-")
            cells.append(f"{value:.2f} {unit}".strip() if isinstance(value, float) else str(value))
        print(f"| {key} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
