"""The ingest service: upstream broker -> landing zone, acknowledging each message only once it is durable.

One paho-mqtt MQTT 5 client per process, in a shared subscription (``$share/<group>/...``) so several
ingest processes split the load. Messages are taken at QoS 1 with ``manual_ack=True``: paho does not send
the PUBACK, we do, after ``LandingWriter.commit()`` has fsynced the line. (QoS 2 is not asked for: paho
answers PUBREC before the application sees the message, so a crash there would lose it.)

The session is persistent (fixed client id, ``clean_start=False``, a session expiry interval), so a
message whose PUBACK never went out - because the process died before or during the write - is sent
again when the process comes back, and lands then.

Acks are group-committed: the loop drains what the socket already has (up to ``max_batch`` messages or
``max_delay_s``), commits once, then acks the lot. It runs on one thread; there are no locks.

A batch PUBLISH (``gateways/+/batches``, docs/message-format.md) lands as one line per message in it; its
one PUBACK waits for the commit that covers all of them, like any other message's.

A lost or refused connection is retried after a wait that doubles from ``RETRY_FIRST_S`` to
``RETRY_MAX_S`` and starts again only once a connection has its subscriptions granted: a broker that takes
the TCP and TLS connection and then refuses the certificate or the password is not sent a new handshake
the moment it closes the last one.
"""

from __future__ import annotations

import logging
import select
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.backoff import Backoff
from pipeline.envelope import Incoming, land_all
from pipeline.landing import LandingWriter
from pipeline.records import (
    DEFAULT_BATCH_FILTER,
    DEFAULT_EVENTS_FILTER,
    DEFAULT_METRICS_FILTER,
)

log = logging.getLogger("pipeline.ingest")


@dataclass
class IngestConfig:
    host: str = "127.0.0.1"
    port: int = 1883
    landing: str = "landing"
    client_id: str = field(default_factory=lambda: f"ingest-{socket.gethostname()}")
    group: str = "ingest"
    topics: Sequence[str] = (DEFAULT_EVENTS_FILTER, DEFAULT_METRICS_FILTER, DEFAULT_BATCH_FILTER)
    metrics_filter: str = DEFAULT_METRICS_FILTER
    batch_filter: str = DEFAULT_BATCH_FILTER
    username: str | None = None
    password: str | None = None
    #: TLS to the cloud broker, as mosquitto_sub's --cafile/--cert/--key: a CA file, or a client
    #: certificate, turns it on; ``tls`` alone uses the system's CAs.
    tls: bool = False
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    session_expiry_s: int = 3600
    keepalive_s: int = 30
    max_batch: int = 500
    max_delay_s: float = 0.05
    roll_seconds: float = 60.0
    roll_bytes: int = 64 << 20
    progress_every_s: float = 30.0


@dataclass
class IngestStats:
    landed: dict[str, int] = field(default_factory=lambda: {"events": 0, "metrics": 0, "quarantine": 0})
    commits: int = 0
    reconnects: int = 0


RETRY_FIRST_S = 0.2
RETRY_MAX_S = 10.0


class Ingest:
    """Run with ``run(stop_event)``; ``ready`` is set once the broker has granted the subscriptions."""

    def __init__(self, config: IngestConfig):
        self.config = config
        self.writer = LandingWriter(config.landing, config.client_id, config.roll_bytes, config.roll_seconds)
        self.stats = IngestStats()
        self.ready = threading.Event()
        self._pending: list[tuple[int, int]] = []  # (mid, qos) of PUBLISHes written, not yet committed and acked
        self._pending_since = 0.0
        self._last_progress = time.monotonic()
        self._retry = Backoff(RETRY_FIRST_S, RETRY_MAX_S)  # the waits before reconnects (module docstring)
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=config.client_id,
            protocol=mqtt.MQTTv5,
            manual_ack=True,
        )
        if config.username is not None:
            self.client.username_pw_set(config.username, config.password)
        if config.tls or config.cafile or config.certfile:
            self.client.tls_set(ca_certs=config.cafile, certfile=config.certfile, keyfile=config.keyfile)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message

    # -- paho callbacks (called from inside client.loop(), on our one thread) -----------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            log.error("connect refused: %s", reason_code)
            return
        subscriptions = [(f"$share/{self.config.group}/{topic}", 1) for topic in self.config.topics]
        client.subscribe(subscriptions)
        log.info("connected to %s:%d as %s (session present: %s)", self.config.host, self.config.port,
                 self.config.client_id, flags.session_present)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties):
        refused = [code for code in reason_codes if code.is_failure]
        if refused:
            log.error("subscription refused: %s", refused)
            return
        self._retry.reset()
        self.ready.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.ready.clear()
        # PUBACKs belong to the connection: the broker sends these messages again after we reconnect,
        # and the copies already written become duplicates that the jobs drop.
        self._pending.clear()
        log.warning("disconnected: %s", reason_code)

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage):
        props = message.properties
        incoming = Incoming(
            topic=message.topic,
            payload=bytes(message.payload),
            received_ms=int(time.time() * 1000),
            user_properties=list(getattr(props, "UserProperty", None) or []),
            content_type=getattr(props, "ContentType", None),
            redelivered=bool(message.dup),
        )
        for landed in land_all(incoming, self.config.metrics_filter, self.config.batch_filter):
            self.writer.append(landed.kind, landed.record)
            self.stats.landed[landed.kind] += 1
        # One PUBLISH, one PUBACK, whatever number of lines it became: all of them are in this commit.
        if message.qos > 0:
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append((message.mid, message.qos))

    # -- loop ------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> IngestStats:
        try:
            self._connect()
            while not stop.is_set():
                rc = self.client.loop(timeout=0.05)
                if rc != mqtt.MQTT_ERR_SUCCESS:
                    self._reconnect(stop)
                    continue
                if self._pending and self._batch_due():
                    self._commit_and_ack()
                self.writer.roll_due()
                self._progress()
            self._commit_and_ack()
            self.client.disconnect()
        finally:
            self.writer.close()
        return self.stats

    def _connect(self) -> None:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = self.config.session_expiry_s
        self.client.connect(self.config.host, self.config.port, keepalive=self.config.keepalive_s,
                            clean_start=False, properties=props)

    def _reconnect(self, stop: threading.Event) -> None:
        """Connect again after the wait the retries have reached (module docstring)."""
        while not stop.wait(delay := self._retry.next_delay()):
            try:
                self.client.reconnect()
                self.stats.reconnects += 1
                return
            except OSError as error:
                log.warning("reconnect failed after %.1fs: %s", delay, error)

    def _batch_due(self) -> bool:
        if len(self._pending) >= self.config.max_batch:
            return True
        if time.monotonic() - self._pending_since >= self.config.max_delay_s:
            return True
        sock = self.client.socket()
        return sock is None or not select.select([sock], [], [], 0)[0]  # nothing more queued: commit now

    def _commit(self) -> None:
        self.writer.commit()
        self.stats.commits += 1

    def _commit_and_ack(self) -> None:
        if not self._pending:
            return
        self._commit()
        for mid, qos in self._pending:
            self.client.ack(mid, qos)
        self._pending.clear()

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress >= self.config.progress_every_s:
            self._last_progress = now
            log.info("landed %s in %d commits", self.stats.landed, self.stats.commits)


def run_ingest(config: IngestConfig) -> int:
    """The ``python -m pipeline ingest`` entry: runs until SIGINT or SIGTERM, then commits and seals."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    ingest = Ingest(config)
    if ingest.writer.recovered:
        log.info("sealed %d in-progress files left by an earlier run", len(ingest.writer.recovered))
    stats = ingest.run(stop)
    log.info("stopped; landed %s", stats.landed)
    return 0
