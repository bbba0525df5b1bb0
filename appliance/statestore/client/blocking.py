"""``StateStoreClient``: the blocking face, and the one paho MQTT 5 connection both faces share."""

from __future__ import annotations

import base64
import concurrent.futures
import socket
import ssl
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

import appliance.statestore.client.calls as calls
from appliance.blocking_clock import SYSTEM_CLOCK
from appliance.statestore import resp3
from appliance.statestore.client.calls import Call
from appliance.statestore.client.errors import (
    NotConnected,
    RequestRejected,
    RequestTimeout,
    StateStoreClientError,
    UnexpectedResponse,
    status_failure,
)
from appliance.statestore.client.lease import Lease
from appliance.statestore.client.results import (
    DeleteResult,
    GetResult,
    Notification,
    RawResponse,
    SetResult,
    parse_notification,
)
from appliance.statestore.commands import Condition
from appliance.statestore.hlc import Hlc, HybridClock
from appliance.statestore.notify import notification_topic
from appliance.statestore.protocol import PROTOCOL_VERSION, REQUEST_TOPIC

DEFAULT_TIMEOUT = 10.0
T = TypeVar("T")


def _disable_nagle(client: mqtt.Client, userdata: object, sock: object) -> None:
    """Requests are small and answered one by one: with Nagle's algorithm on, each waits out the peer's
    delayed ACK (about 40 ms) before it leaves; with it off a blocking SET/GET round trip is under 1 ms."""
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class StateStoreClient:
    """Blocking API; thread safe. ``AsyncStateStoreClient`` wraps the same instance for asyncio."""

    def __init__(
        self,
        host: str,
        port: int,
        client_id: str | None = None,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        keepalive: int = 30,
    ) -> None:
        self.host, self.port = host, port
        self.client_id = client_id or f"statestore-{uuid.uuid4().hex[:12]}"
        self.timeout = timeout
        self.keepalive = keepalive
        self.response_topic = f"clients/{self.client_id}/services/statestore/_any_/command/invoke/response"
        self._notify_prefix = notification_topic(self.client_id, b"")  # ends in ".../command/notify/"
        self.clock = HybridClock(self.client_id)
        self._lock = threading.Lock()
        self._pending: dict[bytes, concurrent.futures.Future[RawResponse]] = {}
        self._by_mid: dict[int, bytes] = {}
        self._early_acks: dict[int, ReasonCode] = {}
        self._watchers: dict[bytes, list[Callable[[Notification], None]]] = {}
        self._connected = threading.Event()
        self._connect_result: ReasonCode | None = None
        self._ever_connected = False
        #: Called (on the MQTT thread) after an automatic reconnect has subscribed again and every watched
        #: key is registered again: from then on no notification is lost.
        self.on_restored: Callable[[], None] | None = None
        self._subacks: dict[int, threading.Event] = {}
        self._mqtt = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)
        if username is not None:
            self._mqtt.username_pw_set(username, password)
        if tls is not None:
            self._mqtt.tls_set_context(tls)
        self._mqtt.on_connect = self._on_connect
        self._mqtt.on_disconnect = self._on_disconnect
        self._mqtt.on_message = self._on_message
        self._mqtt.on_publish = self._on_publish
        self._mqtt.on_subscribe = self._on_subscribe
        self._mqtt.on_socket_open = _disable_nagle

    # -- connection ----------------------------------------------------------------------------------

    def connect(self) -> StateStoreClient:
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = 0
        try:
            self._mqtt.connect(self.host, self.port, keepalive=self.keepalive, clean_start=True, properties=properties)
        except OSError as exc:
            raise NotConnected(f"could not connect to {self.host}:{self.port}: {exc}") from exc
        self._mqtt.loop_start()
        if not self._connected.wait(self.timeout) or self._connect_result is None or self._connect_result.is_failure:
            self.close()
            raise NotConnected(f"could not connect to {self.host}:{self.port}: {self._connect_result}")
        self._subscribe(self.response_topic)
        self._subscribe(self._notify_prefix + "+")
        return self

    def close(self) -> None:
        self._mqtt.disconnect()
        self._mqtt.loop_stop()
        self._fail_all(NotConnected("client closed"))

    def __enter__(self) -> StateStoreClient:
        return self.connect()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _subscribe(self, topic: str) -> None:
        done = threading.Event()
        with self._lock:
            result, mid = self._mqtt.subscribe(topic, qos=1)
            if result != mqtt.MQTT_ERR_SUCCESS or mid is None:
                raise NotConnected(f"subscribe to {topic} failed: {mqtt.error_string(result)}")
            self._subacks[mid] = done
        if not done.wait(self.timeout):
            raise RequestTimeout(f"no SUBACK for {topic}")

    # -- requests ------------------------------------------------------------------------------------

    def submit(
        self, payload: bytes, user_properties: Sequence[tuple[str, str]] = (), *, stamp: bool = True
    ) -> concurrent.futures.Future[RawResponse]:
        """Send one request; the future completes with its ``RawResponse``. ``stamp`` adds ``__ts``."""
        if not self._connected.is_set():
            raise NotConnected("not connected")
        correlation = uuid.uuid4().bytes
        future: concurrent.futures.Future[RawResponse] = concurrent.futures.Future()
        properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        properties.ResponseTopic = self.response_topic
        properties.CorrelationData = correlation
        stamps = [("__ts", str(self._tick()))] if stamp else []
        if not any(name == "__protVer" for name, _ in user_properties):
            stamps.append(("__protVer", PROTOCOL_VERSION))
        properties.UserProperty = stamps + list(user_properties)
        with self._lock:
            self._pending[correlation] = future
        info = self._mqtt.publish(REQUEST_TOPIC, payload, qos=1, properties=properties)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            with self._lock:
                self._pending.pop(correlation, None)
            raise NotConnected(f"publish failed: {mqtt.error_string(info.rc)}")
        with self._lock:
            early = self._early_acks.pop(info.mid, None)  # the PUBACK beat us here
            if early is None:
                self._by_mid[info.mid] = correlation
        if early is not None and early.is_failure:
            self._reject(correlation, early)
        return future

    def request(
        self, payload: bytes, user_properties: Sequence[tuple[str, str]] = (), *, stamp: bool = True, timeout: float | None = None
    ) -> RawResponse:
        return self.wait(self.submit(payload, user_properties, stamp=stamp), timeout)

    def wait(self, future: concurrent.futures.Future[RawResponse], timeout: float | None = None) -> RawResponse:
        try:
            return future.result(self.timeout if timeout is None else timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeout("no response from the state store in time") from None

    def call(self, call: Call[T], timeout: float | None = None) -> T:
        return call.read(self.request(call.payload, call.user_properties, timeout=timeout))

    def set(
        self,
        key: bytes | str,
        value: bytes | str,
        *,
        condition: Condition = Condition.ALWAYS,
        expire_ms: int | None = None,
        fencing_token: Hlc | None = None,
        timeout: float | None = None,
    ) -> SetResult:
        return self.call(calls.set_(key, value, condition, expire_ms, fencing_token), timeout)

    def get(self, key: bytes | str, *, timeout: float | None = None) -> GetResult:
        return self.call(calls.get(key), timeout)

    def delete(self, key: bytes | str, *, fencing_token: Hlc | None = None, timeout: float | None = None) -> DeleteResult:
        return self.call(calls.delete(key, fencing_token), timeout)

    def vdelete(
        self, key: bytes | str, value: bytes | str, *, fencing_token: Hlc | None = None, timeout: float | None = None
    ) -> DeleteResult:
        return self.call(calls.vdelete(key, value, fencing_token), timeout)

    def keynotify(self, key: bytes | str, callback: Callable[[Notification], None], *, timeout: float | None = None) -> None:
        """Watch ``key``: ``callback`` runs on the MQTT thread for every change, in change order."""
        key = calls.as_bytes(key)
        with self._lock:
            self._watchers.setdefault(key, []).append(callback)
        try:
            self.call(calls.keynotify(key), timeout)
        except BaseException:
            with self._lock:
                self._watchers[key].remove(callback)
            raise

    def stop_keynotify(
        self, key: bytes | str, callback: Callable[[Notification], None] | None = None, *, timeout: float | None = None
    ) -> bool:
        """Stop ``callback`` (or every callback) for ``key``; ``KEYNOTIFY key STOP`` goes out when none remain.

        Returns False only if the state store said the key was not watched (``:0``).
        """
        key = calls.as_bytes(key)
        with self._lock:
            callbacks = self._watchers.get(key, [])
            others = [watcher for watcher in callbacks if watcher != callback] if callback is not None else []
            if others:
                self._watchers[key] = others
                return True
        stopped = self.call(calls.keynotify(key, stop=True), timeout)
        # Only now: a notification the server sent before it processed STOP may still have been on its
        # way, and it reaches us before the STOP answer (one connection keeps order), so it is delivered.
        with self._lock:
            self._watchers.pop(key, None)
        return stopped

    def lease(self, name: bytes | str, holder: bytes | str, ttl_ms: int) -> Lease:
        return Lease(self, calls.as_bytes(name), calls.as_bytes(holder), ttl_ms)

    # -- paho callbacks (network thread) -------------------------------------------------------------

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, properties: Any) -> None:
        self._connect_result = reason  # connect() reads it once the event is set, success or not
        reconnected = self._ever_connected and not reason.is_failure
        self._ever_connected = self._ever_connected or not reason.is_failure
        self._connected.set()
        if reconnected:
            self._restore_after_reconnect()

    def _restore_after_reconnect(self) -> None:
        """paho reconnected on its own with a clean session: subscribe and register again.

        The broker handles one connection's packets in order, so the SUBSCRIBEs take effect before the
        KEYNOTIFY requests that follow; their answers need no waiting for.
        """
        self._mqtt.subscribe(self.response_topic, qos=1)
        self._mqtt.subscribe(self._notify_prefix + "+", qos=1)
        with self._lock:
            keys = list(self._watchers)
        futures = [self.submit(calls.keynotify(key).payload) for key in keys]
        remaining = [len(futures)]

        def one_done(_: concurrent.futures.Future[RawResponse]) -> None:
            with self._lock:
                remaining[0] -= 1
                finished = remaining[0] == 0
            if finished and self.on_restored is not None:
                self.on_restored()

        if not futures and self.on_restored is not None:
            self.on_restored()
        for future in futures:
            future.add_done_callback(one_done)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, properties: Any) -> None:
        self._connected.clear()
        self._fail_all(NotConnected(f"disconnected: {reason}"))

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reasons: list[ReasonCode], properties: Any) -> None:
        with self._lock:
            done = self._subacks.pop(mid, None)
        if done is not None:
            done.set()

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: ReasonCode, properties: Any) -> None:
        with self._lock:
            correlation = self._by_mid.pop(mid, None)
            if correlation is None:
                self._early_acks[mid] = reason
        if correlation is not None and reason.is_failure:
            self._reject(correlation, reason)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        props = getattr(message, "properties", None)
        user_properties = tuple(getattr(props, "UserProperty", []) or [])
        if message.topic == self.response_topic:
            correlation = getattr(props, "CorrelationData", None)
            with self._lock:
                future = self._pending.pop(correlation, None) if correlation is not None else None
            if future is None or future.cancelled():
                return
            failure = status_failure(dict(user_properties))
            if failure is not None:
                future.set_exception(failure)
                return
            try:
                payload = bytes(message.payload)
                response = RawResponse(payload, resp3.decode(payload), user_properties)
                if response.version is not None:
                    self._observe(response.version)
            except (resp3.Resp3Error, StateStoreClientError) as exc:
                future.set_exception(UnexpectedResponse(f"unparseable response {message.payload!r}: {exc}"))
                return
            future.set_result(response)
        elif message.topic.startswith(self._notify_prefix):
            self._dispatch_notification(message.topic, bytes(message.payload), user_properties)

    def _dispatch_notification(self, topic: str, payload: bytes, user_properties: tuple[tuple[str, str], ...]) -> None:
        try:
            key = base64.b16decode(topic[len(self._notify_prefix):])
            version = next((v for k, v in user_properties if k == "__ts"), None)
            note = parse_notification(key, payload, version)
        except (ValueError, StateStoreClientError):
            return  # not ours to understand; a newer server may send more kinds
        with self._lock:
            callbacks = list(self._watchers.get(key, ()))
        for callback in callbacks:
            callback(note)

    # -- internals -----------------------------------------------------------------------------------

    def _reject(self, correlation: bytes, reason: ReasonCode) -> None:
        with self._lock:
            future = self._pending.pop(correlation, None)
        if future is not None and not future.done():
            future.set_exception(RequestRejected(reason.value, str(reason)))

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            pending, self._pending, self._by_mid = self._pending, {}, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    def _tick(self) -> Hlc:
        with self._lock:
            return self.clock.tick(SYSTEM_CLOCK.wall_ms())

    def _observe(self, version: Hlc) -> None:
        with self._lock:
            self.clock.receive(version, SYSTEM_CLOCK.wall_ms())
