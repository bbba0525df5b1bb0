"""The state store as a broker service: MQTT 5 request/response in, store changes and notifications out.

This is the only part of the state store that knows about MQTT. It checks the envelope (MQTT 5, QoS 1,
Response Topic, Correlation Data) before anything else and answers a bad envelope through the PUBACK -
there is no valid place to send a payload answer to - and everything about the *payload* through a
response message, as the protocol requires. The order of checks for a request is:

1. envelope (response topic first: a forbidden one disconnects the client whatever else is wrong);
2. payload -> command (``commands.parse_command``);
3. authorization of the user for the key;
4. ``__ts`` (SET requires it; any command may carry it) and ``__ft``: syntax, then clock skew;
5. the store (fencing, conditions, quotas), which commits before we publish the response.

Every response carries ``__stat=200`` (the SDK command invokers require a status) and, where there is a
version to report, ``__ts``. Notifications are published after the response, in change order, through
``BrokerHandle.publish``, which preserves call order per subscriber.

Store calls run on the event loop thread: they are short SQLite transactions, and running them inline
keeps one total order of changes (and so of notifications) without locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from appliance.broker.api import BrokerHandle, InboundPublish, PublishVerdict
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
from appliance.statestore.notify import NOTIFY_TOPIC_PREFIX, SYSTEM_ID, NotificationRegistry
from appliance.statestore.store import EXPIRE_BATCH, Change, Quotas, StateStore

log = logging.getLogger(__name__)

REQUEST_TOPIC = f"statestore/v1/{SYSTEM_ID}/command/invoke"
MAX_CLOCK_SKEW_MS = 60_000

# MQTT 5 reason codes for envelope failures (PUBACK/PUBREC and DISCONNECT).
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
TOPIC_NAME_INVALID = 0x90


# Accepted requests are consumed: ordinary subscribers of the system topic never see them.
CONSUMED = PublishVerdict(route=False)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def refused(reason: str) -> PublishVerdict:
    return PublishVerdict(reason_code=IMPLEMENTATION_SPECIFIC_ERROR, reason_string=reason, route=False)


def forbidden_response_topic(topic: str) -> bool:
    return topic == REQUEST_TOPIC or topic.startswith(NOTIFY_TOPIC_PREFIX)


class StateStoreService:
    topic_filters = (REQUEST_TOPIC,)

    def __init__(self, config: StateStoreConfig, data_dir: Path, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self.config = config
        self.data_dir = Path(data_dir)
        self.clock_ms = clock_ms
        self.authorizer = KeyAuthorizer(config.acl)
        self.registry = NotificationRegistry()
        self.store: StateStore | None = None
        self._broker: BrokerHandle | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._wake_sweeper = asyncio.Event()

    # -- BrokerService -------------------------------------------------------------------------------

    async def start(self, broker: BrokerHandle) -> None:
        self._broker = broker
        self.store = StateStore(
            self.data_dir, self.config.node_id, Quotas(self.config.max_keys, self.config.max_bytes), self.config.sync
        )
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever(), name="statestore-expiry")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self.store is not None:
            self.store.close()
            self.store = None

    def on_client_disconnected(self, client_id: str) -> None:
        self.registry.drop_client(client_id)

    async def on_publish(self, message: InboundPublish) -> PublishVerdict:
        if message.response_topic is not None and forbidden_response_topic(message.response_topic):
            return PublishVerdict(
                reason_code=TOPIC_NAME_INVALID,
                reason_string="invalid response topic for the state store",
                disconnect=TOPIC_NAME_INVALID,
                route=False,
            )
        if message.protocol_level != 5:
            return refused("the state store requires MQTT 5")
        if message.qos != 1:
            return refused("state store requests must be QoS 1")
        if not message.response_topic:
            return refused("missing response topic")
        if message.correlation_data is None:
            return refused("missing correlation data")
        payload, version, changes = self.handle_request(message)
        properties = [("__stat", "200")]
        if version is not None:
            properties.append(("__ts", str(version)))
        broker = self._require_broker()
        broker.publish(
            message.response_topic,
            payload,
            qos=1,
            correlation_data=message.correlation_data,
            user_properties=properties,
        )
        self._publish_changes(changes)
        return CONSUMED

    # -- requests ------------------------------------------------------------------------------------

    def handle_request(self, message: InboundPublish) -> tuple[bytes, Hlc | None, list[Change]]:
        """Payload in, (response payload, version for ``__ts``, committed changes) out."""
        try:
            command = parse_command(message.payload)
            self._authorize(message.username, command)
            now = self.clock_ms()
            timestamp = self._timestamp(message, "__ts", errors.TIMESTAMP_SKEW, now)
            fencing_token = self._timestamp(message, "__ft", errors.FENCING_TOKEN_SKEW, now)
            return self._execute(command, message.client_id, timestamp, fencing_token, now)
        except StateStoreError as exc:
            return resp3.encode_error(exc.message), None, []

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

    def _execute(
        self, command: Command, client_id: str, timestamp: Hlc | None, fencing_token: Hlc | None, now: int
    ) -> tuple[bytes, Hlc | None, list[Change]]:
        store = self._require_store()
        if isinstance(command, SetCommand):
            if timestamp is None:
                raise StateStoreError(errors.MISSING_TIMESTAMP)
            outcome = store.set(command, timestamp, fencing_token, now)
            if outcome.applied and command.expire_ms is not None:
                self._wake_sweeper.set()
            return (resp3.OK if outcome.applied else resp3.encode_integer(-1)), outcome.version, outcome.changes
        if isinstance(command, GetCommand):
            entry = store.get(command.key, now)
            if entry is None:
                return resp3.encode_bulk(None), None, []
            return resp3.encode_bulk(entry.value), entry.version, []
        if isinstance(command, (DelCommand, VDelCommand)):
            only_value = command.value if isinstance(command, VDelCommand) else None
            deleted = store.delete(command.key, fencing_token, now, only_value)
            return resp3.encode_integer(deleted.count), deleted.version, deleted.changes
        if command.stop:
            removed = self.registry.unregister(client_id, command.key)
            return (resp3.OK if removed else resp3.encode_integer(0)), None, []
        self.registry.register(client_id, command.key)
        return resp3.OK, None, []

    # -- notifications and expiry --------------------------------------------------------------------

    def _publish_changes(self, changes: list[Change]) -> None:
        if not changes:
            return
        broker = self._require_broker()
        for change in changes:
            for note in self.registry.notifications(change):
                broker.publish(note.topic, note.payload, qos=1, user_properties=[("__ts", note.version)])

    async def _sweep_forever(self) -> None:
        """Remove expired entries at their deadline (woken early by every SET with PX)."""
        interval = self.config.sweep_interval_ms / 1000
        while True:
            delay = interval
            try:
                store = self._require_store()
                now = self.clock_ms()
                changes = store.expire(now)
                self._publish_changes(changes)
                if len(changes) == EXPIRE_BATCH:
                    delay = 0
                else:
                    due = store.next_expiry()
                    if due is not None:
                        delay = min(interval, max(0, due - now) / 1000)
            except Exception:  # a full disk must not end expiry for good; log and retry
                log.exception("state store expiry sweep failed")
            if delay == 0:
                await asyncio.sleep(0)  # a large backlog: let requests in between batches
                continue
            self._wake_sweeper.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_sweeper.wait(), delay)

    def _require_store(self) -> StateStore:
        if self.store is None:
            raise RuntimeError("the state store service has not been started")
        return self.store

    def _require_broker(self) -> BrokerHandle:
        if self._broker is None:
            raise RuntimeError("the state store service has not been started")
        return self._broker
