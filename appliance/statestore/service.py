"""The state store as a broker service: MQTT 5 request/response in, store changes and notifications out.

This is the only part of the state store that knows about MQTT. The protocol is Microsoft Learn's "MQTT
broker state store protocol" (https://learn.microsoft.com/azure/iot-operations/create-edge-apps/concept-about-state-store-protocol);
where the SDK clients expect otherwise we follow them (docs/statestore-differences.md).

Rules
-----
* A request is checked in this order, and the first failure answers it:

  1. the envelope (MQTT 5, QoS 1, Response Topic, Correlation Data, ``__protVer``), by the module every
     in-process service shares, ``request_envelope.open_request``; the response topic first: a forbidden
     one, or one the client may not itself publish to under the broker's ACL, disconnects the client
     whatever else is wrong;
  2. payload -> command (``commands.parse_command``);
  3. authorization of the user for the key;
  4. ``__ts`` (SET requires it; any command may carry it) and ``__ft``: syntax, then clock skew;
  5. the store (fencing, conditions, quotas), which commits before the response is published.

* A bad envelope is answered through the PUBACK (there is no valid place to send a payload answer to);
  everything about the *payload* is answered with a response message, as the protocol requires.
* ``__protVer`` is read the way the SDK executors read it: absent means 1.0, any 1.x is served, anything
  else gets status 505 with ``__supProtMajVer`` and ``__requestProtVer``.
* Every response carries ``__stat`` (the SDK command invokers require a status), ``__protVer`` (what the
  SDK executors send) and, where there is a version to report, ``__ts``.
* Never a confused deputy: a response goes only to a topic the requesting client may itself publish to
  (``BrokerHandle.may_publish``, the broker ACL in force when the request arrives), and a notification
  only to a notification topic its registered client may publish to, checked at registration and again at
  every notification (a SIGHUP may have changed the ACL since). Otherwise a client that may not write
  ``c/#`` could have a value of its choosing delivered to ``c/...`` subscribers through us. So: a response
  topic the client may not write is refused like a forbidden one (PUBACK 0x87, then DISCONNECT 0x87); a
  KEYNOTIFY whose notification topic it may not write is answered ``-ERR not authorized`` and registers
  nothing; a registration whose topic became unwritable is dropped at its next notification, unsent.
* A store failure (SQLite error: disk full, read-only or corrupt file) rolls the transaction back and the
  client gets status 500 with ``__stMsg`` instead of a RESP3 payload: the SDK invokers turn that into a
  remote error at once, where no reply would be a timeout. It is logged once per change of state
  (``store_health``: failing, then healthy again once a change commits), not once per request.

Theory of operation
-------------------
The SQLite store lives on one worker thread (``StoreThread``) that opened its connection and is the only
thread to touch it, so a commit's fsync (``sync = "full"``) stalls nobody but the requests queued behind
it. Ordering holds without locks: the worker runs store calls in submission order, and their results come
back to the loop in completion order (each completion is a ``call_soon_threadsafe``, which is FIFO), so the
task that submitted first resumes first and publishes its response and notifications - synchronously, with
no await in between - before the next one. A client's own requests are in order anyway, since the broker
awaits ``on_publish`` before reading that client's next packet. The response is published only after the
worker's commit returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.broker.api import (
    BrokerHandle,
    InboundPublish,
    PublishVerdict,
    ServiceDefaults,
)
from appliance.broker.request_envelope import EnvelopeRules, Request, open_request, respond
from appliance.prometheus import Family
from appliance.runtime import Runtime, wall_ms
from appliance.statestore import errors, resp3
from appliance.statestore.acl import KeyAuthorizer
from appliance.statestore.commands import (
    Command,
    DelCommand,
    GetCommand,
    KeyNotifyCommand,
    SetCommand,
    VDelCommand,
    parse_command,
)
from appliance.statestore.config import StateStoreConfig
from appliance.statestore.errors import StateStoreError
from appliance.statestore.hlc import Hlc, HlcFormatError
from appliance.statestore.notify import (
    NOTIFY_TOPIC_PREFIX,
    NotificationRegistry,
    notification_topic,
)
from appliance.statestore.protocol import (
    PROTOCOL_VERSION,
    REQUEST_TOPIC,
    SUPPORTED_MAJOR_VERSIONS,
    supported_protocol_version,
)
from appliance.statestore.store import (
    EXPIRE_BATCH,
    FILE_NAME,
    Change,
    Quotas,
    StateStore,
)
from appliance.store_health import StoreHealth
from appliance.store_thread import StoreThread

log = logging.getLogger(__name__)

MAX_CLOCK_SKEW_MS = 60_000


# Response statuses (``__stat``), HTTP-like as in the SDKs.
STATUS_OK = "200"
STATUS_INTERNAL_ERROR = "500"
STORE_FAILURE_MESSAGE = "the state store could not complete the request (storage failure); see the gateway log"

# Accepted requests are consumed: ordinary subscribers of the system topic never see them.
CONSUMED = PublishVerdict(route=False)


#: The request/response envelope (``appliance.broker.request_envelope``): the SDKs' RPC convention, and
#: no response topic in the notification space (a response there would forge a notification).
ENVELOPE = EnvelopeRules(
    service="the state store", requests="state store requests",
    request_topic=REQUEST_TOPIC, reserved_prefixes=(NOTIFY_TOPIC_PREFIX,),
    protocol_version=PROTOCOL_VERSION, supported_majors=SUPPORTED_MAJOR_VERSIONS,
    accepts_version=supported_protocol_version,
)


@dataclass(slots=True)
class Reply:
    """What a request gets: the RESP3 payload, the version for ``__ts``, and the changes to notify."""

    payload: bytes
    version: Hlc | None = None
    changes: list[Change] = field(default_factory=list)
    wake_sweeper: bool = False


StoreFactory = Callable[[Path, str, Quotas, str], StateStore]


class StateStoreService(ServiceDefaults):
    topic_filters: tuple[str, ...] = (REQUEST_TOPIC,)

    def __init__(
        self,
        config: StateStoreConfig,
        data_dir: Path,
        runtime: Runtime | None = None,
        store_factory: StoreFactory = StateStore,
    ) -> None:
        """``runtime``: the clock (HLC timestamps and expiry are its wall time) and the sweeper's sleeps;
        ``store_factory`` exists for tests: a store with hooks."""
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self.config = config
        self.data_dir = Path(data_dir)
        self.store_factory = store_factory
        self.thread: StoreThread | None = None
        self.authorizer = KeyAuthorizer(config.acl)
        self.registry = NotificationRegistry()
        self.store: StateStore | None = None
        self._broker: BrokerHandle | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._wake_sweeper = asyncio.Event()
        #: Whether ``statestore.db`` commits, logged once per change.
        self.health = StoreHealth(str(self.data_dir / FILE_NAME), log,
                                  "requests it cannot complete get status 500 until a change commits again")

    # -- BrokerService -------------------------------------------------------------------------------

    async def start(self, broker: BrokerHandle) -> None:
        self._broker = broker
        self.thread = StoreThread("statestore-store")
        quotas = Quotas(self.config.max_keys, self.config.max_bytes)
        # Opened on the worker thread: the connection belongs to it from the first statement on.
        self.store = await self.thread.call(self.store_factory, self.data_dir, self.config.node_id, quotas, self.config.sync)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever(), name="statestore-expiry")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self.thread is not None:
            if self.store is not None:
                await self.thread.call(self.store.close)
            self.thread.shutdown()
            self.thread = None
        self.store = None

    async def metrics(self) -> list[Family]:
        """Whether ``statestore.db`` commits (``appliance_store_*{store="statestore"}``)."""
        return self.health.families("statestore")

    def on_client_disconnected(self, client_id: str) -> None:
        self.registry.drop_client(client_id)

    async def on_publish(self, message: InboundPublish) -> PublishVerdict:
        request = open_request(ENVELOPE, self._require_broker(), message)
        if isinstance(request, PublishVerdict):
            return request
        try:
            reply = await self.handle_request(message)
        except sqlite3.Error as exc:
            self._store_failed(exc)
            self.health.refused += 1
            log.debug("state store: request from client %r on key %r failed, nothing changed: %s",
                      message.client_id, _key_of(message.payload), exc)
            self._respond(request, b"", [("__stat", STATUS_INTERNAL_ERROR), ("__stMsg", STORE_FAILURE_MESSAGE)])
            return CONSUMED
        if reply.changes:  # a change was committed: writes work (a read proves nothing about them)
            self.health.succeeded(self.runtime.monotonic())
        properties = [("__stat", STATUS_OK)]
        if reply.version is not None:
            properties.append(("__ts", str(reply.version)))
        self._respond(request, reply.payload, properties)
        self._publish_changes(reply.changes)
        if reply.wake_sweeper:
            self._wake_sweeper.set()
        return CONSUMED

    def _store_failed(self, exc: sqlite3.Error) -> None:
        disk_full = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
        self.health.failed(str(exc), disk_full, self.runtime.monotonic())

    def _respond(self, request: Request, payload: bytes, properties: list[tuple[str, str]]) -> None:
        respond(ENVELOPE, self._require_broker(), request, payload, properties)

    # -- requests ------------------------------------------------------------------------------------

    async def handle_request(self, message: InboundPublish) -> Reply:
        """Payload in, reply out; raises ``sqlite3.Error`` when the store fails (rolled back)."""
        try:
            command = parse_command(message.payload)
            self._authorize(message.username, command)
            now = wall_ms(self.runtime)
            timestamp = self._timestamp(message, "__ts", errors.TIMESTAMP_SKEW, now)
            fencing_token = self._timestamp(message, "__ft", errors.FENCING_TOKEN_SKEW, now)
            if isinstance(command, KeyNotifyCommand):
                return self._keynotify(command, message.client_id, message.username)
            if isinstance(command, SetCommand) and timestamp is None:
                raise StateStoreError(errors.MISSING_TIMESTAMP)
            return await self._require_thread().call(self._execute, command, timestamp, fencing_token)
        except StateStoreError as exc:
            return Reply(resp3.encode_error(exc.message))

    def _authorize(self, username: str | None, command: Command) -> None:
        access = "read" if isinstance(command, (GetCommand, KeyNotifyCommand)) else "write"
        if not self.authorizer.allows(username, command.key, access):
            raise StateStoreError(errors.NOT_AUTHORIZED)

    @staticmethod
    def _timestamp(message: InboundPublish, name: str, skew_error: str, now: int) -> Hlc | None:
        text = next((value for key, value in message.user_properties if key == name), None)
        if text is None:
            return None
        try:
            stamp = Hlc.parse(text)
        except HlcFormatError:
            raise StateStoreError(errors.MALFORMED_TIMESTAMP) from None
        if stamp.wall_ms > now + MAX_CLOCK_SKEW_MS:
            raise StateStoreError(skew_error)
        return stamp

    def _keynotify(self, command: KeyNotifyCommand, client_id: str, username: str | None) -> Reply:
        """Registrations are loop-side memory: a change's notifications go to whoever is registered when
        its committed result is published. The client must be allowed to publish to its notification
        topic itself, as for a response topic."""
        if command.stop:
            removed = self.registry.unregister(client_id, command.key)
            return Reply(resp3.OK if removed else resp3.encode_integer(0))
        if not self._require_broker().may_publish(client_id, username, notification_topic(client_id, command.key)):
            raise StateStoreError(errors.NOT_AUTHORIZED)
        if not self.registry.register(client_id, command.key, username):
            raise StateStoreError(errors.QUOTA_EXCEEDED)
        return Reply(resp3.OK)

    def _execute(self, command: Command, timestamp: Hlc | None, fencing_token: Hlc | None) -> Reply:
        """Runs on the store thread. ``now`` is read here, when the store acts, so an entry that expired
        while the request waited in the queue is already absent."""
        store = self._require_store()
        now = wall_ms(self.runtime)
        if isinstance(command, SetCommand):
            assert timestamp is not None  # checked on the loop
            outcome = store.set(command, timestamp, fencing_token, now)
            payload = resp3.OK if outcome.applied else resp3.encode_integer(-1)
            return Reply(payload, outcome.version, outcome.changes, outcome.applied and command.expire_ms is not None)
        if isinstance(command, GetCommand):
            entry = store.get(command.key, now)
            if entry is None:
                return Reply(resp3.encode_bulk(None))
            return Reply(resp3.encode_bulk(entry.value), entry.version)
        assert isinstance(command, (DelCommand, VDelCommand))
        only_value = command.value if isinstance(command, VDelCommand) else None
        deleted = store.delete(command.key, fencing_token, now, only_value)
        return Reply(resp3.encode_integer(deleted.count), deleted.version, deleted.changes)

    # -- notifications and expiry --------------------------------------------------------------------

    def _publish_changes(self, changes: list[Change]) -> None:
        if not changes:
            return
        broker = self._require_broker()
        for change in changes:
            for note in self.registry.notifications(change):
                if not broker.may_publish(note.client_id, note.username, note.topic):
                    log.info("state store: client %r may no longer publish to its notification topic %r; "
                             "its registration for that key ends", note.client_id, note.topic)
                    self.registry.unregister(note.client_id, change.key)
                    continue
                broker.publish(
                    note.topic, note.payload, qos=1,
                    user_properties=[("__ts", note.version), ("__protVer", PROTOCOL_VERSION)],
                )

    def _expire_due(self) -> tuple[list[Change], int | None, int]:
        """Runs on the store thread: remove what is due, and say when the next deadline is."""
        store = self._require_store()
        now = wall_ms(self.runtime)
        changes = store.expire(now)
        return changes, store.next_expiry(), now

    async def _sweep_forever(self) -> None:
        """Remove expired entries at their deadline (woken early by every SET with PX)."""
        interval = self.config.sweep_interval_ms / 1000
        while True:
            delay = interval
            self._wake_sweeper.clear()  # before the store trip: a SET with PX during the trip must still wake us
            try:
                changes, due, now = await self._require_thread().call(self._expire_due)
                if changes:
                    self.health.succeeded(self.runtime.monotonic())
                self._publish_changes(changes)
                if len(changes) == EXPIRE_BATCH:
                    delay = 0
                elif due is not None:
                    delay = min(interval, max(0, due - now) / 1000)
            except sqlite3.Error as exc:  # a full disk must not end expiry for good; retry
                self._store_failed(exc)
            except Exception:
                log.exception("state store expiry sweep failed")
            self.health.tick(self.runtime.monotonic())
            if delay == 0:
                await self.runtime.sleep(0)  # a large backlog: let requests in between batches
                continue
            with contextlib.suppress(TimeoutError):
                # runtime.timeout, not wait_for: on 3.11 wait_for can drop a stop()'s cancellation
                async with self.runtime.timeout(delay):
                    await self._wake_sweeper.wait()

    def _require_thread(self) -> StoreThread:
        if self.thread is None:
            raise RuntimeError("the state store service has not been started")
        return self.thread

    def _require_store(self) -> StateStore:
        if self.store is None:
            raise RuntimeError("the state store service has not been started")
        return self.store

    def _require_broker(self) -> BrokerHandle:
        if self._broker is None:
            raise RuntimeError("the state store service has not been started")
        return self._broker


def _key_of(payload: bytes) -> bytes | None:
    """The key of a request, for the log line of a failure (the payload parsed before the store ran)."""
    try:
        return parse_command(payload).key
    except StateStoreError:
        return None
