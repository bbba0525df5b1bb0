"""A state store client on paho-mqtt (MQTT 5): blocking and asyncio APIs, key notifications, leases.

Why it is built this way:

* **One MQTT connection, many requests in flight.** Each request gets fresh Correlation Data and a
  ``concurrent.futures.Future``; the paho network thread completes it from the response (or fails it from a
  PUBACK with a failure reason code). The blocking API waits on the future, the asyncio API wraps it with
  ``asyncio.wrap_future`` - one implementation, two faces.
* **Subscribe first.** The response topic and this client's notification topics are subscribed (and the
  SUBACK awaited) while connecting, before any request can be sent, as the protocol asks.
* **The caller never builds an HLC.** The client keeps a hybrid clock of its own: every request carries
  ``__ts`` from it, and every version it receives moves it forward (the HLC receive rule).
* **The SDK invokers' envelope.** Requests carry ``__protVer`` 1.0 as the SDK command invokers send it; a
  response with a ``__protVer`` of another major, or with a failure ``__stat`` (500 for a storage failure,
  505 for an unsupported version), fails the request with ``StatusError`` - no RESP3 payload to read.
* **Every ``-ERR`` is an exception class** (``FencingTokenRequired``, ``QuotaExceeded``, ...), and an
  unknown one is a plain ``ServiceError`` with the text, so callers can handle future error strings.
* **Leases** (``Lease``) are the protocol's active/standby example: acquire and renew with
  ``SET name holder NEX PX ttl``, release with ``VDEL name holder``, and the lock's version is the
  fencing token for the keys it protects.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from appliance.statestore import errors, resp3
from appliance.statestore.commands import Condition, DelCommand, GetCommand, KeyNotifyCommand, SetCommand, VDelCommand
from appliance.statestore.hlc import Hlc, HlcFormatError, HybridClock
from appliance.statestore.notify import notification_topic
from appliance.statestore.service import PROTOCOL_VERSION, REQUEST_TOPIC, supported_protocol_version

DEFAULT_TIMEOUT = 10.0


def _disable_nagle(client: mqtt.Client, userdata: object, sock: object) -> None:
    """Requests are small and answered one by one: with Nagle's algorithm on, each waits out the peer's
    delayed ACK (about 40 ms) before it leaves; with it off a blocking SET/GET round trip is under 1 ms."""
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# -- errors ------------------------------------------------------------------------------------------


class StateStoreClientError(Exception):
    """Base of everything this client raises."""


class NotConnected(StateStoreClientError):
    pass


class RequestTimeout(StateStoreClientError, TimeoutError):
    pass


class RequestRejected(StateStoreClientError):
    """The broker refused the request publish itself (PUBACK reason code >= 0x80)."""

    def __init__(self, reason_code: int, reason: str) -> None:
        super().__init__(f"request rejected: 0x{reason_code:02X} {reason}")
        self.reason_code = reason_code


class UnexpectedResponse(StateStoreClientError):
    """The response payload is not one this request can get."""


class StatusError(StateStoreClientError):
    """A response whose ``__stat`` is a failure: the service answered, but not with a RESP3 reply."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"state store status {status}: {message}")
        self.status = status
        self.message = message


class ServiceError(StateStoreClientError):
    """``-ERR <message>`` from the state store; subclasses for the protocol's known strings."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TimestampSkew(ServiceError): ...
class FencingTokenRequired(ServiceError): ...
class FencingTokenSkew(ServiceError): ...
class FencingTokenLower(ServiceError): ...
class QuotaExceeded(ServiceError): ...
class RequestSyntaxError(ServiceError): ...
class NotAuthorized(ServiceError): ...
class UnknownCommand(ServiceError): ...
class WrongNumberOfArguments(ServiceError): ...
class MissingTimestamp(ServiceError): ...
class MalformedTimestamp(ServiceError): ...
class KeyLengthZero(ServiceError): ...


ERROR_CLASSES: dict[str, type[ServiceError]] = {
    errors.TIMESTAMP_SKEW: TimestampSkew,
    errors.FENCING_TOKEN_REQUIRED: FencingTokenRequired,
    errors.FENCING_TOKEN_SKEW: FencingTokenSkew,
    errors.FENCING_TOKEN_LOWER: FencingTokenLower,
    errors.QUOTA_EXCEEDED: QuotaExceeded,
    errors.SYNTAX_ERROR: RequestSyntaxError,
    errors.NOT_AUTHORIZED: NotAuthorized,
    errors.UNKNOWN_COMMAND: UnknownCommand,
    errors.WRONG_NUMBER_OF_ARGUMENTS: WrongNumberOfArguments,
    errors.MISSING_TIMESTAMP: MissingTimestamp,
    errors.MALFORMED_TIMESTAMP: MalformedTimestamp,
    errors.KEY_LENGTH_ZERO: KeyLengthZero,
}


# -- results -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Response:
    """A raw response: the payload, its decoded RESP3 value and the user properties."""

    payload: bytes
    value: resp3.Value
    user_properties: tuple[tuple[str, str], ...]

    @property
    def version(self) -> Hlc | None:
        text = next((v for k, v in self.user_properties if k == "__ts"), None)
        try:
            return Hlc.parse(text) if text is not None else None
        except HlcFormatError:
            raise UnexpectedResponse(f"malformed __ts in response: {text!r}") from None


@dataclass(frozen=True, slots=True)
class SetResult:
    applied: bool
    version: Hlc | None


@dataclass(frozen=True, slots=True)
class GetResult:
    value: bytes | None
    version: Hlc | None


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """``count``: 1 deleted, 0 no such key, -1 VDEL value mismatch."""

    count: int
    version: Hlc | None


@dataclass(frozen=True, slots=True)
class Notification:
    """A change to a watched key: ``value`` None means deleted (DEL, VDEL or expiry)."""

    key: bytes
    value: bytes | None
    version: Hlc | None


def _status_failure(properties: dict[str, str]) -> StateStoreClientError | None:
    """What the SDK invokers check before the payload: the response's protocol version, then its status."""
    version = properties.get("__protVer")
    if not supported_protocol_version(version):
        return UnexpectedResponse(f"response protocol version {version!r} is not supported")
    status = properties.get("__stat", "200")
    if not status.isdigit() or int(status) >= 400:
        return StatusError(status, properties.get("__stMsg", ""))
    return None


def raise_for_error(response: Response) -> None:
    if isinstance(response.value, resp3.ErrorReply):
        text = response.value.text.decode("utf-8", "replace")
        message = text[4:] if text.startswith("ERR ") else text
        raise ERROR_CLASSES.get(message, ServiceError)(message)


def set_result(response: Response) -> SetResult:
    raise_for_error(response)
    if response.value == resp3.SimpleString(b"OK"):
        return SetResult(True, response.version)
    if response.value == -1:
        return SetResult(False, response.version)
    raise UnexpectedResponse(f"SET answered {response.payload!r}")


def get_result(response: Response) -> GetResult:
    raise_for_error(response)
    if response.value is None or isinstance(response.value, bytes):
        return GetResult(response.value, response.version)
    raise UnexpectedResponse(f"GET answered {response.payload!r}")


def delete_result(response: Response) -> DeleteResult:
    raise_for_error(response)
    if isinstance(response.value, int):
        return DeleteResult(response.value, response.version)
    raise UnexpectedResponse(f"DEL/VDEL answered {response.payload!r}")


def keynotify_result(response: Response) -> bool:
    """True: registered (or stopped); False: STOP for a key that was not watched (``:0``)."""
    raise_for_error(response)
    if response.value == resp3.SimpleString(b"OK"):
        return True
    if response.value == 0:
        return False
    raise UnexpectedResponse(f"KEYNOTIFY answered {response.payload!r}")


def parse_notification(key: bytes, payload: bytes, version: str | None) -> Notification:
    value = resp3.decode(payload)
    stamp = Hlc.parse(version) if version else None
    if value in ([b"NOTIFY", b"DELETE"], [b"NOTIFY", b"DEL"]):  # the SDK clients' word, and the document's
        return Notification(key, None, stamp)
    if isinstance(value, list) and len(value) == 4 and value[:3] == [b"NOTIFY", b"SET", b"VALUE"] and isinstance(value[3], bytes):
        return Notification(key, value[3], stamp)
    raise UnexpectedResponse(f"not a notification: {payload!r}")


def as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


# -- the client --------------------------------------------------------------------------------------


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
        self._pending: dict[bytes, concurrent.futures.Future[Response]] = {}
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
        self._mqtt = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)
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

    def connect(self) -> "StateStoreClient":
        properties = Properties(PacketTypes.CONNECT)
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

    def __enter__(self) -> "StateStoreClient":
        return self.connect()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _subscribe(self, topic: str) -> None:
        done = threading.Event()
        with self._lock:
            result, mid = self._mqtt.subscribe(topic, qos=1)
            if result != mqtt.MQTT_ERR_SUCCESS:
                raise NotConnected(f"subscribe to {topic} failed: {mqtt.error_string(result)}")
            self._subacks[mid] = done
        if not done.wait(self.timeout):
            raise RequestTimeout(f"no SUBACK for {topic}")

    # -- requests ------------------------------------------------------------------------------------

    def submit(
        self, payload: bytes, user_properties: Sequence[tuple[str, str]] = (), *, stamp: bool = True
    ) -> concurrent.futures.Future[Response]:
        """Send one request; the future completes with its ``Response``. ``stamp`` adds ``__ts``."""
        if not self._connected.is_set():
            raise NotConnected("not connected")
        correlation = uuid.uuid4().bytes
        future: concurrent.futures.Future[Response] = concurrent.futures.Future()
        properties = Properties(PacketTypes.PUBLISH)
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

    def request(self, payload: bytes, user_properties: Sequence[tuple[str, str]] = (), *, stamp: bool = True, timeout: float | None = None) -> Response:
        return self.wait(self.submit(payload, user_properties, stamp=stamp), timeout)

    def wait(self, future: concurrent.futures.Future[Response], timeout: float | None = None) -> Response:
        try:
            return future.result(self.timeout if timeout is None else timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeout("no response from the state store in time") from None

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
        command = SetCommand(as_bytes(key), as_bytes(value), condition, expire_ms)
        return set_result(self.request(command.encode(), fencing(fencing_token), timeout=timeout))

    def get(self, key: bytes | str, *, timeout: float | None = None) -> GetResult:
        return get_result(self.request(GetCommand(as_bytes(key)).encode(), timeout=timeout))

    def delete(self, key: bytes | str, *, fencing_token: Hlc | None = None, timeout: float | None = None) -> DeleteResult:
        return delete_result(self.request(DelCommand(as_bytes(key)).encode(), fencing(fencing_token), timeout=timeout))

    def vdelete(
        self, key: bytes | str, value: bytes | str, *, fencing_token: Hlc | None = None, timeout: float | None = None
    ) -> DeleteResult:
        command = VDelCommand(as_bytes(key), as_bytes(value))
        return delete_result(self.request(command.encode(), fencing(fencing_token), timeout=timeout))

    def keynotify(self, key: bytes | str, callback: Callable[[Notification], None], *, timeout: float | None = None) -> None:
        """Watch ``key``: ``callback`` runs on the MQTT thread for every change, in change order."""
        key = as_bytes(key)
        with self._lock:
            self._watchers.setdefault(key, []).append(callback)
        try:
            keynotify_result(self.request(KeyNotifyCommand(key).encode(), timeout=timeout))
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
        key = as_bytes(key)
        with self._lock:
            callbacks = self._watchers.get(key, [])
            others = [watcher for watcher in callbacks if watcher != callback] if callback is not None else []
            if others:
                self._watchers[key] = others
                return True
        stopped = keynotify_result(self.request(KeyNotifyCommand(key, stop=True).encode(), timeout=timeout))
        # Only now: a notification the server sent before it processed STOP may still have been on its
        # way, and it reaches us before the STOP answer (one connection keeps order), so it is delivered.
        with self._lock:
            self._watchers.pop(key, None)
        return stopped

    def lease(self, name: bytes | str, holder: bytes | str, ttl_ms: int) -> "Lease":
        return Lease(self, as_bytes(name), as_bytes(holder), ttl_ms)

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
        futures = [self.submit(KeyNotifyCommand(key).encode()) for key in keys]
        remaining = [len(futures)]

        def one_done(_: concurrent.futures.Future[Response]) -> None:
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
            failure = _status_failure(dict(user_properties))
            if failure is not None:
                future.set_exception(failure)
                return
            try:
                response = Response(message.payload, resp3.decode(message.payload), user_properties)
                if response.version is not None:
                    self._observe(response.version)
            except (resp3.Resp3Error, StateStoreClientError) as exc:
                future.set_exception(UnexpectedResponse(f"unparseable response {message.payload!r}: {exc}"))
                return
            future.set_result(response)
        elif message.topic.startswith(self._notify_prefix):
            self._dispatch_notification(message.topic, message.payload, user_properties)

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
            return self.clock.tick(time.time_ns() // 1_000_000)

    def _observe(self, version: Hlc) -> None:
        with self._lock:
            self.clock.receive(version, time.time_ns() // 1_000_000)


def fencing(token: Hlc | None) -> list[tuple[str, str]]:
    return [("__ft", str(token))] if token is not None else []


class Lease:
    """A lock key held with ``SET name holder NEX PX ttl``; ``fencing_token`` is its latest version."""

    def __init__(self, client: StateStoreClient, name: bytes, holder: bytes, ttl_ms: int) -> None:
        self.client, self.name, self.holder, self.ttl_ms = client, name, holder, ttl_ms
        self.fencing_token: Hlc | None = None

    def acquire(self, *, wait: float = 0.0, timeout: float | None = None) -> bool:
        """True if this holder owns the lock now. With ``wait``, retry for that many seconds.

        Waiting is event-driven: the lock key is watched (KEYNOTIFY) and every change to it - a release or
        an expiry - triggers the next attempt, so a free lock is taken as soon as the store says so.
        """
        if self.renew(timeout=timeout) or wait <= 0:
            return self.fencing_token is not None
        changed = threading.Event()

        def on_change(note: Notification) -> None:
            changed.set()

        deadline = time.monotonic() + wait
        self.client.keynotify(self.name, on_change, timeout=timeout)
        try:
            while True:
                changed.clear()  # before the attempt, so a change right after it is not missed
                if self.renew(timeout=timeout):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                changed.wait(remaining)
        finally:
            self.client.stop_keynotify(self.name, on_change, timeout=timeout)

    def renew(self, *, timeout: float | None = None) -> bool:
        """One ``SET name holder NEX PX ttl``: takes a free lock or extends ours; updates the token."""
        result = self.client.set(self.name, self.holder, condition=Condition.NEX, expire_ms=self.ttl_ms, timeout=timeout)
        self.fencing_token = result.version if result.applied else None
        return result.applied

    def current_holder(self, *, timeout: float | None = None) -> bytes | None:
        """Who holds the lock now (its value), or None if nobody does."""
        return self.client.get(self.name, timeout=timeout).value

    def release(self, *, timeout: float | None = None) -> bool:
        """Delete the lock only if this holder still owns it."""
        owned = self.client.vdelete(self.name, self.holder, timeout=timeout).count == 1
        self.fencing_token = None
        return owned


class AsyncStateStoreClient:
    """The asyncio face of a ``StateStoreClient`` (the MQTT I/O stays on paho's thread)."""

    def __init__(self, client: StateStoreClient) -> None:
        self.sync = client

    async def __aenter__(self) -> "AsyncStateStoreClient":
        await asyncio.to_thread(self.sync.connect)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.sync.close)

    async def request(self, payload: bytes, user_properties: Sequence[tuple[str, str]] = (), *, stamp: bool = True, timeout: float | None = None) -> Response:
        future = self.sync.submit(payload, user_properties, stamp=stamp)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.sync.timeout if timeout is None else timeout)
        except TimeoutError:
            raise RequestTimeout("no response from the state store in time") from None

    async def set(
        self,
        key: bytes | str,
        value: bytes | str,
        *,
        condition: Condition = Condition.ALWAYS,
        expire_ms: int | None = None,
        fencing_token: Hlc | None = None,
        timeout: float | None = None,
    ) -> SetResult:
        command = SetCommand(as_bytes(key), as_bytes(value), condition, expire_ms)
        return set_result(await self.request(command.encode(), fencing(fencing_token), timeout=timeout))

    async def get(self, key: bytes | str, *, timeout: float | None = None) -> GetResult:
        return get_result(await self.request(GetCommand(as_bytes(key)).encode(), timeout=timeout))

    async def delete(self, key: bytes | str, *, fencing_token: Hlc | None = None, timeout: float | None = None) -> DeleteResult:
        return delete_result(await self.request(DelCommand(as_bytes(key)).encode(), fencing(fencing_token), timeout=timeout))

    async def vdelete(
        self, key: bytes | str, value: bytes | str, *, fencing_token: Hlc | None = None, timeout: float | None = None
    ) -> DeleteResult:
        command = VDelCommand(as_bytes(key), as_bytes(value))
        return delete_result(await self.request(command.encode(), fencing(fencing_token), timeout=timeout))

    async def watch(self, key: bytes | str, *, timeout: float | None = None) -> "NotificationStream":
        """Register for ``key`` now (so no change after this returns is missed) and return the stream.

        Use it as ``async with await client.watch(k) as notes: async for note in notes: ...``; leaving the
        block sends ``KEYNOTIFY key STOP``.
        """
        stream = NotificationStream(self.sync, as_bytes(key), asyncio.get_running_loop())
        await asyncio.to_thread(self.sync.keynotify, stream.key, stream.deliver, timeout=timeout)
        return stream


class NotificationStream:
    """An async iterator of one key's notifications, fed from the MQTT thread in change order."""

    def __init__(self, client: StateStoreClient, key: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.key, self.loop = client, key, loop
        self.queue: asyncio.Queue[Notification] = asyncio.Queue()

    def deliver(self, note: Notification) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, note)

    def __aiter__(self) -> "NotificationStream":
        return self

    async def __anext__(self) -> Notification:
        return await self.queue.get()

    async def close(self) -> None:
        if self.client._connected.is_set():
            await asyncio.to_thread(self.client.stop_keynotify, self.key)

    async def __aenter__(self) -> "NotificationStream":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
