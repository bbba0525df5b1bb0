"""The ``$upstream`` endpoint: an MQTT bridge (paho-mqtt, MQTT 5 or 3.1.1) to the cloud broker.

* QoS 1, and a message counts as sent only once its PUBACK (and those of the messages before it) is in:
  the pump takes messages off their queue after that, never before (at-least-once; the message id is
  stable across retries). Two formats (docs/message-format.md): ``message`` publishes each message with
  its ``gw-*`` user properties, at most ``estimate.window()`` unacknowledged; ``batch`` packs the pump's
  batch into PUBLISHes of ``packed_window().chunk_bytes`` (appliance/forwarding/batch.py), at most a
  window's worth of them unacknowledged - on a slow link the identity then costs a few bytes per message
  instead of more than the payload.
* One network thread per bridge runs the paho client by hand (``client.loop``) so that reconnecting is
  ours: exponential backoff with jitter, and a *fresh* client per connection - paho would otherwise replay
  its own in-flight copies on reconnect while the pump resends the batch too.
* Acknowledgements are timestamped on the network thread and resolved on the event loop (via
  ``call_soon_threadsafe``), so a future is always registered before its PUBACK is looked at.
* The link under the bridge (the cellular modem) may be known to be down: ``set_link(False)`` closes the
  connection and the network thread makes no attempt at all until ``set_link(True)``, which also skips
  any backoff still running - retrying blindly over a modem that is not registered only burns the
  backoff ceiling, and the link coming back is the best moment to connect.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.forwarding.batch import encode_batch
from appliance.forwarding.config import UpstreamConfig
from appliance.forwarding.endpoints import Refused, SendFailed, identity_properties, message_id
from appliance.forwarding.metrics import LinkStats
from appliance.forwarding.queues import QueuedMessage
from appliance.forwarding.routes import UPSTREAM
from appliance.forwarding.window import LinkEstimate, Window

log = logging.getLogger(__name__)


def backoff_delay(attempt: int, minimum: float, maximum: float, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": half fixed, half random, so a fleet does not reconnect in step."""
    ceiling = min(maximum, minimum * (2**min(attempt, 30)))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def wire_size(topic: str, payload: bytes, properties: Properties | None) -> int:
    """Roughly the PUBLISH packet's size: what the link actually carries for it."""
    size = 2 + 2 + 2 + len(topic) + 8 + len(payload)
    for key, value in getattr(properties, "UserProperty", None) or ():
        size += 5 + len(key) + len(value)
    return size


def pack(batch: list[QueuedMessage], chunk_bytes: int) -> list[list[QueuedMessage]]:
    """Consecutive runs of ``batch`` of at most ``chunk_bytes`` payload each (at least one message)."""
    chunks: list[list[QueuedMessage]] = []
    size = 0
    for item in batch:
        if not chunks or size + item.size > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += item.size
    return chunks


class UpstreamSender:
    def __init__(self, settings: UpstreamConfig, gateway_id: str, stats: LinkStats) -> None:
        assert settings.host is not None
        self.id = UPSTREAM
        self.settings = settings
        self.gateway_id = gateway_id
        self.stats = stats
        self.estimate = LinkEstimate()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = asyncio.Event()
        self._stop = threading.Event()
        # Guards the two things the network thread waits for: stop, and the link state (with a counter
        # of up-transitions, so a backoff wait can tell that the link came back while it slept).
        self._wake = threading.Condition()
        self._link_up = True
        self._link_ups = 0
        self.on_connection_change: Callable[[bool], None] | None = None  # on the event loop
        self._thread: threading.Thread | None = None
        self._client: mqtt.Client | None = None
        self._pending: dict[int, asyncio.Future[float]] = {}
        self._acks: dict[int, tuple[float, str | None]] = {}  # mid -> (when, refusal reason or None)
        self._rng = random.Random()
        self._ready_flag = False
        self._max_packet: int | None = None  # the upstream's Maximum Packet Size (MQTT 5 CONNACK)
        self.connects = 0

    # -- lifecycle

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._network_main, name="forwarding-upstream", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        with self._wake:
            self._stop.set()
            self._wake.notify_all()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10)

    def set_link(self, up: bool) -> None:
        """The link under the bridge went up or down (thread-safe; called from the event loop)."""
        with self._wake:
            if up == self._link_up:
                return
            self._link_up = up
            if up:
                self._link_ups += 1
            self._wake.notify_all()
        log.info("upstream: link %s: %s", "up" if up else "down", "connecting" if up else "no connection attempts until it is back")

    # -- network thread

    def _wait_for_link(self) -> None:
        with self._wake:
            self._wake.wait_for(lambda: self._stop.is_set() or self._link_up)

    def _backoff(self, delay: float) -> None:
        """Sleep ``delay``, but wake at once on stop or when the link comes (back) up meanwhile."""
        with self._wake:
            ups = self._link_ups
            self._wake.wait_for(lambda: self._stop.is_set() or self._link_ups != ups, timeout=delay)

    def _new_client(self) -> mqtt.Client:
        s = self.settings
        v5 = s.protocol == "5"
        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=s.client_id or self.gateway_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            clean_session=None if v5 else True,
        )
        client.max_inflight_messages_set(65535)
        client.max_queued_messages_set(0)
        if s.username is not None:
            client.username_pw_set(s.username, s.password)
        if s.tls:
            client.tls_set(
                ca_certs=str(s.ca_file) if s.ca_file else None,
                certfile=str(s.cert_file) if s.cert_file else None,
                keyfile=str(s.key_file) if s.key_file else None,
                cert_reqs=ssl.CERT_NONE if s.tls_insecure else ssl.CERT_REQUIRED,
            )
            client.tls_insecure_set(s.tls_insecure)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        return client

    def _network_main(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self._wait_for_link()
            if self._stop.is_set():
                break
            ups = self._link_ups
            client = self._new_client()
            self._client = client
            try:
                client.connect(self.settings.host, self.settings.port, keepalive=self.settings.keepalive_s)
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; ValueError: bad host name
                log.info("upstream %s:%s: connect failed: %s", self.settings.host, self.settings.port, exc)
            else:
                while not self._stop.is_set() and self._link_up:
                    if client.loop(timeout=0.05) != mqtt.MQTT_ERR_SUCCESS:
                        break
                    if self._ready_flag:
                        attempt = 0
                if self._stop.is_set() or not self._link_up:
                    client.disconnect()
                    client.loop(timeout=0.1)
            self._set_ready(False)
            self._client = None
            if self._link_ups != ups:
                attempt = 0  # the link came back since this attempt began: a new link, try at once
            elif not self._stop.is_set() and self._link_up:
                delay = backoff_delay(attempt, self.settings.backoff_min_s, self.settings.backoff_max_s, self._rng)
                attempt += 1
                self._backoff(delay)

    def _set_ready(self, ready: bool) -> None:
        if ready == self._ready_flag:
            return
        self._ready_flag = ready
        self.stats.connected = ready
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._apply_ready, ready)

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            log.warning("upstream refused the connection: %s", reason)
            client.disconnect()
            return
        self.connects += 1
        self._max_packet = getattr(properties, "MaximumPacketSize", None)
        log.info("upstream connected to %s:%s", self.settings.host, self.settings.port)
        self._set_ready(True)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        log.info("upstream disconnected: %s", reason)
        self._set_ready(False)

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        refusal = f"{reason} (0x{reason.value:02X})" if getattr(reason, "is_failure", False) else None
        self._acks[mid] = (time.monotonic(), refusal)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._resolve, mid)

    # -- event loop side

    def _apply_ready(self, ready: bool) -> None:
        if self.on_connection_change is not None:
            self.on_connection_change(ready)
        if ready:
            self.estimate.reset()
            self._ready.set()
            return
        self._ready.clear()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(SendFailed("upstream connection lost"))
        self._pending.clear()
        self._acks.clear()

    def _resolve(self, mid: int) -> None:
        future = self._pending.pop(mid, None)
        ack = self._acks.pop(mid, None)
        if future is None or ack is None or future.done():
            return
        at, refusal = ack
        if refusal is None:
            future.set_result(at)
        else:
            future.set_exception(Refused(refusal))

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def topic_for(self, item: QueuedMessage) -> str:
        m = item.message
        return self.settings.topic_template.format(
            gateway_id=self.gateway_id, device_id=m.device_id, module_id=m.module_id or "", output=m.output or "",
            message_id=message_id(item, self.gateway_id), priority=item.priority,
        )

    def publish_direct(self, topic: str, payload: bytes) -> None:
        """Fire-and-forget QoS 1 (gateway metrics): skipped while disconnected, never queued."""
        client = self._client
        if client is not None and self._ready.is_set():
            client.publish(topic, payload, qos=1)

    def window(self) -> Window:
        if self.settings.format == "message":
            return self.estimate.window()
        limit = self.settings.batch_max_bytes
        if self._max_packet is not None:  # room for the fixed header, topic and batch header
            limit = max(1, min(limit, self._max_packet - 512))
        return self.estimate.packed_window(limit)

    def _units(self, batch: list[QueuedMessage], sent_ms: int) -> list[tuple[list[QueuedMessage], str, bytes, Properties | None]]:
        """What goes out for ``batch``: (messages, topic, payload, properties) per PUBLISH."""
        if self.settings.format == "batch":
            chunk = self.window().chunk_bytes
            assert chunk is not None
            return [
                (items, self.settings.batch_topic.format(gateway_id=self.gateway_id, priority=items[0].priority),
                 encode_batch(self.gateway_id, items[0].priority, sent_ms, items), None)
                for items in pack(batch, chunk)
            ]
        units = []
        for item in batch:
            properties = None
            if self.settings.protocol == "5":
                properties = Properties(PacketTypes.PUBLISH)
                properties.UserProperty = identity_properties(item, self.gateway_id, sent_ms)
                if item.message.content_type:
                    properties.ContentType = item.message.content_type
            units.append(([item], self.topic_for(item), item.message.payload, properties))
        return units

    def _in_flight_limit(self) -> int:
        """PUBLISHes that may be unacknowledged, re-read after every ack so it follows the link."""
        window = self.window()
        if window.chunk_bytes is None:
            return window.messages
        assert window.bytes is not None
        return max(2, -(-window.bytes // window.chunk_bytes))

    async def send(self, batch: list[QueuedMessage], preempt: asyncio.Event) -> int:
        """Publish with at most ``_in_flight_limit()`` unacknowledged; stop handing out PUBLISHes once
        ``preempt`` is set. Returns how many messages (a prefix of ``batch``) are acknowledged."""
        client = self._client
        if client is None or not self._ready.is_set():
            raise SendFailed("upstream not connected")
        assert self._loop is not None
        sent_at = time.monotonic()
        sent_ms = int(time.time() * 1000)
        futures: list[asyncio.Future[float]] = []
        sizes: list[int] = []
        ack_times: list[float] = []
        published: list[list[QueuedMessage]] = []  # the messages of each PUBLISH handed out

        async def next_ack() -> None:
            index = len(ack_times)
            try:
                ack_times.append(await futures[index])
            except Refused as refused:
                acked = sum(len(items) for items in published[:index])
                raise Refused(refused.reason, [item.seq for item in published[index]], acked) from None

        try:
            for items, topic, payload, properties in self._units(batch, sent_ms):
                while len(futures) - len(ack_times) >= self._in_flight_limit():
                    await next_ack()
                    self.estimate.record_progress(sizes[: len(ack_times)], ack_times)
                if preempt.is_set():
                    break
                info = client.publish(topic, payload, qos=1, properties=properties)
                if info.rc != mqtt.MQTT_ERR_SUCCESS:
                    raise SendFailed(f"publish failed: {mqtt.error_string(info.rc)}")
                # Registered before control returns to the loop, so the _resolve queued by the PUBACK finds it.
                future: asyncio.Future[float] = self._loop.create_future()
                self._pending[info.mid] = future
                futures.append(future)
                sizes.append(wire_size(topic, payload, properties))
                published.append(items)
            while len(ack_times) < len(futures):
                await next_ack()
        except SendFailed:
            for f in futures:
                if not f.done():
                    f.cancel()
                elif not f.cancelled():
                    f.exception()
            raise
        self.estimate.record(sizes, ack_times, sent_at)
        messages = sum(len(items) for items in published)
        self.stats.bytes_sent += sum(item.size for item in batch[:messages])
        self.stats.rate_bps = self.estimate.rate_bps
        self.stats.rtt_s = self.estimate.rtt_s
        return messages
