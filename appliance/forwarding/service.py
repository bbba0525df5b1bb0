"""``ForwardingService``: the store-and-forward pipeline as a ``BrokerService`` inside the broker.

``on_publish`` runs the routes and commits the message with all its queue entries before it returns, so
the device's PUBACK means "stored". Commits are grouped: publishes that arrive while a commit is running
(from other clients - the broker awaits one client's publishes in order) queue up and go to the store
thread together as the next transaction, each caller resuming when that one commit is durable. Under load
one fsync then covers a whole batch of devices; alone, a publish waits for no timer. Everything after that -
pumps, the upstream bridge, cleanup, metrics, manifest reloads - runs as tasks next to the broker and never
blocks a publisher.

A reload (file change; SIGHUP, which the gateway's handler forwards to ``reload``; ``appliance routes
reload``) swaps the evaluator only if the new manifest
is valid in full; pending messages keep the priority and TTL they were stored with, and pumps of endpoints
the new routes no longer mention keep draining what is queued for them. The outcome of the last load is
written to ``forwarding-routes.json`` in the data dir for ``appliance routes show``.

With ``hardware`` (the gateway passes its ``HardwareService``) the modem's link state gates the upstream
bridge (no connection attempts while the modem is not registered), the uplink LED shows whether the bridge
is connected, and the backlog LED follows the number of queued entries, re-read at most every
``BACKLOG_REFRESH_S`` so a burst of publishes costs one ``COUNT(*)``, not one per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from appliance import atomic_file
from appliance.asyncio_runtime import AsyncioRuntime
from appliance.broker.api import (
    ACCEPTED,
    QUOTA_EXCEEDED,
    UNSPECIFIED_ERROR,
    BrokerHandle,
    InboundPublish,
    PublishVerdict,
    ServiceDefaults,
    ServiceStartError,
)
from appliance.forwarding.config import ForwardingConfig
from appliance.forwarding.endpoints import BrokeredSender, EndpointSender
from appliance.forwarding.ingress_log import RefusalLog
from appliance.forwarding.manifest import Manifest, ManifestError, load_manifest
from appliance.forwarding.messages import Message, message_from_publish
from appliance.forwarding.metrics import ForwardingMetrics, LinkStats
from appliance.forwarding.pump import Pump
from appliance.forwarding.queues import MessageStore, QueueKey, StoreFull
from appliance.forwarding.routes import (
    UPSTREAM,
    Endpoint,
    Evaluator,
    Route,
    RouteResult,
)
from appliance.forwarding.upstream import UpstreamSender
from appliance.forwarding.validity import InvalidMessage
from appliance.prometheus import Family
from appliance.runtime import Runtime, wall_ms
from appliance.store_health import StoreHealth
from appliance.store_thread import StoreThread

log = logging.getLogger("appliance.forwarding")

STORE_FILE = "forwarding.db"
STATUS_FILE = "forwarding-routes.json"
#: The latest metrics document (docs/message-format.md), rewritten every ``metrics_interval_s``.
METRICS_FILE = "forwarding-metrics.json"
#: The backlog LED is a glance indicator: a quarter second behind the queue is soon enough.
BACKLOG_REFRESH_S = 0.25


class LinkPanel(Protocol):
    """What forwarding needs from the hardware (``appliance.hardware.service.HardwareService``)."""

    @property
    def link_up(self) -> bool: ...

    def on_link_change(self, listener: Callable[[bool], None]) -> Callable[[], None]: ...

    def show_uplink(self, up: bool) -> None: ...

    def show_backlog(self, queued: int) -> None: ...


def _brokered_endpoint(endpoint_id: str) -> Endpoint:
    _, module, _, input_name = endpoint_id.split("/", 3)
    return Endpoint(endpoint_id, module, input_name)


def with_expiry(results: list[RouteResult], expiry_s: int) -> list[RouteResult]:
    """MQTT 5 Message Expiry Interval: the device says the message is worthless after ``expiry_s``, so
    each queue keeps it for the smaller of its route's TTL and that (0: expired on arrival, never sent)."""
    return [dataclasses.replace(r, ttl_s=min(r.ttl_s, expiry_s)) for r in results]


class ForwardingService(ServiceDefaults):
    topic_filters: tuple[str, ...] = ("devices/#",)

    def __init__(self, config: ForwardingConfig, data_dir: Path, gateway_id: str, hardware: LinkPanel | None = None,
                 runtime: Runtime | None = None) -> None:
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self.config = config
        self.hardware = hardware
        self._backlog_dirty = asyncio.Event()
        self._unsubscribe_link: Callable[[], None] = lambda: None
        self._commit_queue: list[tuple[Message, list[RouteResult], asyncio.Future[tuple[int, Counter[QueueKey]]]]] = []
        self._committer: asyncio.Task[None] | None = None
        self.data_dir = Path(data_dir)
        self.gateway_id = gateway_id
        self.figures = ForwardingMetrics(started_ms=wall_ms(self.runtime))
        self.evaluator = Evaluator(())
        self.manifest: Manifest | None = None
        self.store: MessageStore | None = None
        self.thread = StoreThread("forwarding-store")
        self.pumps: dict[str, Pump] = {}
        self.upstream: UpstreamSender | None = None
        self._broker: BrokerHandle | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._manifest_mtime: float | None = None
        self._load_error = ""  # why the last manifest load failed
        #: Whether ``forwarding.db`` commits, logged once per change (a full disk is not a line per publish).
        self.health = StoreHealth(str(self.data_dir / STORE_FILE), log,
                                  "device messages to forward are refused until a commit succeeds")
        self.refusal_log = RefusalLog(log, self.runtime.monotonic)

    # -- lifecycle

    async def start(self, broker: BrokerHandle) -> None:
        """Load the manifest, open the store, start the bridge and a pump per endpoint with messages.

        A manifest that does not load refuses the start (``ServiceStartError``, naming the file, the JSON
        path and the line or column): a gateway that acknowledged every device message and routed none
        would lose them silently. Without a manifest there are no routes; that is logged, and every
        message is counted as ``unrouted``."""
        self._broker = broker
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.config.manifest is None:
            log.warning("forwarding: enabled without a manifest: no routes; device messages are acknowledged, "
                        "not forwarded, and counted as unrouted")
            self._write_status()
        elif not self.load_manifest():
            raise ServiceStartError(f"forwarding manifest {self.config.manifest} rejected: {self._load_error}")
        self.store = await self.thread.call(
            MessageStore,
            self.data_dir / STORE_FILE,
            self.config.max_store_bytes,
            self.config.check_entire_queue_on_cleanup,
            self.runtime.now,
        )
        if self.config.upstream.host is not None:
            stats = self.figures.links.setdefault(UPSTREAM, LinkStats(clock=self.runtime.now))
            self.upstream = UpstreamSender(self.config.upstream, self.gateway_id, stats, self.runtime)
            if self.hardware is not None:
                self.upstream.on_connection_change = self.hardware.show_uplink
                self.upstream.set_link(self.hardware.link_up)  # before the thread starts: no attempt while down
                self._unsubscribe_link = self.hardware.on_link_change(self.upstream.set_link)
            self.upstream.start()
        for endpoint_id in await self.thread.call(self.store.endpoints):
            self._pump_for(Endpoint(UPSTREAM) if endpoint_id == UPSTREAM else _brokered_endpoint(endpoint_id))
        if self.upstream is not None:
            self._pump_for(Endpoint(UPSTREAM))  # from the start, so its state is in the metrics before a message
        self._tasks += [
            asyncio.create_task(self._cleanup_loop(), name="forwarding-cleanup"),
            asyncio.create_task(self._metrics_loop(), name="forwarding-metrics"),
        ]
        if self.config.manifest is not None:
            self._tasks.append(asyncio.create_task(self._watch_manifest(), name="forwarding-watch"))
        if self.hardware is not None:
            self._backlog_dirty.set()  # show what a restart found queued
            self._tasks.append(asyncio.create_task(self._backlog_loop(self.hardware), name="forwarding-backlog-led"))

    async def stop(self) -> None:
        self._unsubscribe_link()
        for pump in self.pumps.values():
            pump.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks + [p.task for p in self.pumps.values() if p.task is not None]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.upstream is not None:
            await self.upstream.stop()
        if self.store is not None:
            await self.thread.call(self.store.close)
        self.thread.shutdown()

    def on_client_disconnected(self, client_id: str) -> None:
        return None

    def healthy(self) -> bool:
        """Every pump runs (one that failed is down until it has read its queues again): the gateway
        feeds the systemd watchdog only while this holds."""
        return all(pump.running for pump in self.pumps.values())

    # -- ingest

    async def on_publish(self, message: InboundPublish) -> PublishVerdict:
        try:
            parsed = message_from_publish(message.topic, message.payload, message.user_properties, message.content_type)
        except InvalidMessage as exc:
            # MQTT 5: the reason code says why. MQTT 3.1.1 has none: the PUBACK is sent, nothing is queued
            # (as mosquitto answers a publish its ACL denies); a disconnect would only have the device send
            # the same message again, forever. docs/forwarding.md "Refused at ingress".
            self.figures.refused[exc.reason] += 1
            self.refusal_log.refused(exc.reason, message.client_id, message.topic, exc.detail, exc.reason_code)
            return PublishVerdict(exc.reason_code, exc.detail[:200])
        if parsed is None or self.store is None:
            return ACCEPTED
        results = self.evaluator.evaluate(parsed)
        if not results:
            self.figures.unrouted += 1
            return ACCEPTED
        if message.message_expiry_interval is not None:
            results = with_expiry(results, message.message_expiry_interval)
        try:
            _, dropped = await self._store(parsed, results)
        except StoreFull as exc:
            for result in results:
                self.figures.count("dropped", result.endpoint.id, result.priority)
            log.warning("forwarding: refused a message from %s: %s", message.client_id, exc)
            return PublishVerdict(reason_code=QUOTA_EXCEEDED, reason_string="gateway store full")
        except sqlite3.Error as exc:  # the commit failed (a full disk): nothing of the message is stored
            disk_full = self._store_failed(exc)
            self.health.refused += 1
            code = QUOTA_EXCEEDED if disk_full else UNSPECIFIED_ERROR
            # MQTT 3.1.1 has no negative PUBACK: its connection closes unacknowledged and the device resends.
            return PublishVerdict(code, "the gateway cannot store messages now",
                                  disconnect=None if message.protocol_level == 5 else code)
        self.health.succeeded(self.runtime.monotonic())
        self.figures.add("dropped", dropped)
        self._backlog_dirty.set()
        for result in results:
            pump = self._pump_for(result.endpoint)
            if pump is not None:
                pump.notify(result.priority)
        return ACCEPTED

    def _store_failed(self, exc: sqlite3.Error) -> bool:
        """Note a failed store call (logged once per change of state); returns whether the disk is full."""
        disk_full = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
        self.health.failed(str(exc), disk_full, self.runtime.monotonic())
        return disk_full

    async def _store(self, message: Message, results: list[RouteResult]) -> tuple[int, Counter[QueueKey]]:
        """Queue the message for the next group commit and wait until that commit is durable."""
        future: asyncio.Future[tuple[int, Counter[QueueKey]]] = asyncio.get_running_loop().create_future()
        self._commit_queue.append((message, results, future))
        if self._committer is None:
            # Runs from the next loop turn, so every publish handled in this turn joins the first batch.
            self._committer = asyncio.create_task(self._commit_queued(), name="forwarding-group-commit")
        return await future

    async def _commit_queued(self) -> None:
        assert self.store is not None
        try:
            while self._commit_queue:
                batch, self._commit_queue = self._commit_queue, []
                try:
                    outcomes = await self.thread.call(self.store.add_many, [(m, r) for m, r, _ in batch])
                except Exception as exc:  # the commit failed: nothing of the batch is stored
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, _, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():  # its publisher's task was cancelled meanwhile
                        continue
                    if isinstance(outcome, Exception):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            self._committer = None

    def _pump_for(self, endpoint: Endpoint) -> Pump | None:
        """The endpoint's pump, started on first use; None for $upstream when no upstream is configured
        (its messages wait in their queues until one is)."""
        pump = self.pumps.get(endpoint.id)
        if pump is None:
            assert self.store is not None
            sender: EndpointSender | None
            if endpoint.is_upstream:
                sender = self.upstream
            else:
                assert self._broker is not None
                sender = BrokeredSender(endpoint, self._broker, self.gateway_id, self.runtime)
            if sender is None:
                return None
            pump = Pump(sender, self.store, self.thread, self.figures, on_checkpoint=self._backlog_dirty.set,
                        max_link_drops=self.config.max_link_drops, runtime=self.runtime)
            self.pumps[endpoint.id] = pump
            pump.start()
        return pump

    # -- routes

    def reload(self) -> None:
        """SIGHUP: the manifest again."""
        self.load_manifest()

    def load_manifest(self) -> bool:
        """Load the manifest file; on any error keep the running routes. Returns True if swapped."""
        path = self.config.manifest
        if path is None:
            self._write_status()
            return False
        with contextlib.suppress(OSError):
            self._manifest_mtime = path.stat().st_mtime
        try:
            manifest = load_manifest(path)
        except ManifestError as exc:
            self._load_error = str(exc)
            log.error("forwarding: manifest %s rejected, keeping %d running routes: %s", path, len(self.evaluator.routes), exc)
            self._write_status(error=str(exc))
            return False
        self.manifest = manifest
        self.evaluator = manifest.evaluator()
        log.info("forwarding: routes loaded from %s: %d routes, global TTL %ds", path, len(manifest.routes), manifest.global_ttl_s)
        self._write_status()
        return True

    def _write_status(self, error: str | None = None) -> None:
        status = {
            "pid": os.getpid(),
            "updated_ms": wall_ms(self.runtime),
            "manifest": str(self.config.manifest) if self.config.manifest else None,
            "error": error,
            "global_ttl_s": self.evaluator.global_ttl_s,
            "routes": [self._route_status(r) for r in self.evaluator.routes],
        }
        atomic_file.write_bytes(self.data_dir / STATUS_FILE, (json.dumps(status, indent=2) + "\n").encode())

    def _route_status(self, route: Route) -> dict[str, Any]:
        """A running route as ``routes show`` prints it: ``timeToLiveSecs`` as configured (0: none of its
        own), ``effectiveTimeToLiveSecs`` what its messages are stored with and ``timeToLiveFrom`` why."""
        assert self.manifest is not None
        ttl, origin = self.manifest.ttl_origin(route)
        return {"name": route.name, "route": route.text, "priority": route.priority, "timeToLiveSecs": route.ttl_s,
                "effectiveTimeToLiveSecs": ttl, "timeToLiveFrom": origin, "endpoint": route.endpoint.id}

    async def _watch_manifest(self) -> None:
        """Reload when the manifest's modification time changes (checked every ``watch_interval_s``)."""
        assert self.config.manifest is not None
        while True:
            await self.runtime.sleep(self.config.watch_interval_s)
            try:
                mtime = self.config.manifest.stat().st_mtime
            except OSError:
                continue
            if mtime != self._manifest_mtime:
                self.load_manifest()

    # -- housekeeping

    async def _cleanup_loop(self) -> None:
        assert self.store is not None
        while True:
            try:
                expired: Counter[tuple[str, int]] = await self.thread.call(self.store.cleanup)
            except sqlite3.Error as exc:  # a full disk must not end the cleanup for good: next round
                self._store_failed(exc)
                expired = Counter()
            self.health.tick(self.runtime.monotonic())
            if expired:
                self._backlog_dirty.set()
                self.figures.add("expired", expired)
                log.info("forwarding: cleanup removed %d expired messages: %s", sum(expired.values()),
                         ", ".join(f"{e}_Pri{p}={n}" for (e, p), n in sorted(expired.items())))
            await self.runtime.sleep(self.config.cleanup_interval_s)

    async def _backlog_loop(self, hardware: LinkPanel) -> None:
        assert self.store is not None
        while True:
            await self._backlog_dirty.wait()
            self._backlog_dirty.clear()
            hardware.show_backlog(await self.thread.call(self.store.entry_count))
            await self.runtime.sleep(BACKLOG_REFRESH_S)  # a rate limit: changes meanwhile wait for the next round

    async def metrics_document(self) -> bytes:
        assert self.store is not None
        depths = await self.thread.call(self.store.depths)
        return self.figures.to_json(self.gateway_id, depths, wall_ms(self.runtime), self.health)

    async def _metrics_loop(self) -> None:
        """Every ``metrics_interval_s`` from the start: the document retained on ``$SYS``, sent upstream, and
        written to ``forwarding-metrics.json`` in the data dir, where ``appliance doctor`` reads it."""
        while True:
            document = await self.metrics_document()
            assert self._broker is not None
            self._broker.publish("$SYS/gateway/forwarding/metrics", document, qos=0, retain=True)
            if self.upstream is not None:
                self.upstream.publish_direct(f"gateways/{self.gateway_id}/metrics", document)
            try:
                # Off the loop: the fsync of a rename can take a while on flash, and the broker shares the loop.
                await asyncio.to_thread(atomic_file.write_bytes, self.data_dir / METRICS_FILE, document + b"\n")
            except OSError as exc:  # a full disk: the store's health says so; the next round tries again
                log.debug("forwarding: cannot write %s: %s", METRICS_FILE, exc)
            await self.runtime.sleep(self.config.metrics_interval_s)

    async def metrics(self) -> list[Family]:
        """The queues and links, and whether ``forwarding.db`` commits, for the gateway's Prometheus page."""
        assert self.store is not None
        depths = await self.thread.call(self.store.depths)
        return [*self.figures.families(depths, wall_ms(self.runtime)), *self.health.families("forwarding")]
