"""A state store client on paho-mqtt (MQTT 5): blocking and asyncio APIs, key notifications, leases.

Rules
-----

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
* **Each request is built once** (``calls.py``): a ``Call`` holds the RESP3 payload, the user properties
  and how to read the answer, and the blocking and asyncio faces only differ in how they wait for it.
* **Leases** (``Lease``) are the protocol's active/standby example: acquire and renew with
  ``SET name holder NEX PX ttl``, release with ``VDEL name holder``, and the lock's version is the
  fencing token for the keys it protects.

The package: ``errors`` (one exception class per ``-ERR``), ``results`` (responses and what they mean),
``calls`` (requests), ``blocking`` (``StateStoreClient``, the paho connection), ``aio``
(``AsyncStateStoreClient``, ``NotificationStream``), ``lease`` (``Lease``). It imports nothing of the
server: the envelope both sides share is ``appliance.statestore.protocol``.
"""

from appliance.statestore.client.aio import AsyncStateStoreClient, NotificationStream
from appliance.statestore.client.blocking import DEFAULT_TIMEOUT, StateStoreClient
from appliance.statestore.client.calls import Call
from appliance.statestore.client.errors import (
    ERROR_CLASSES,
    FencingTokenLower,
    FencingTokenRequired,
    FencingTokenSkew,
    KeyLengthZero,
    MalformedTimestamp,
    MissingTimestamp,
    NotAuthorized,
    NotConnected,
    QuotaExceeded,
    RequestRejected,
    RequestSyntaxError,
    RequestTimeout,
    ServiceError,
    StateStoreClientError,
    StatusError,
    TimestampSkew,
    UnexpectedResponse,
    UnknownCommand,
    WrongNumberOfArguments,
)
from appliance.statestore.client.lease import Lease
from appliance.statestore.client.results import (
    DeleteResult,
    GetResult,
    Notification,
    RawResponse,
    SetResult,
)
from appliance.statestore.commands import Condition

__all__ = [
    "DEFAULT_TIMEOUT",
    "ERROR_CLASSES",
    "AsyncStateStoreClient",
    "Call",
    "Condition",
    "DeleteResult",
    "FencingTokenLower",
    "FencingTokenRequired",
    "FencingTokenSkew",
    "GetResult",
    "KeyLengthZero",
    "Lease",
    "MalformedTimestamp",
    "MissingTimestamp",
    "NotAuthorized",
    "NotConnected",
    "Notification",
    "NotificationStream",
    "QuotaExceeded",
    "RawResponse",
    "RequestRejected",
    "RequestSyntaxError",
    "RequestTimeout",
    "ServiceError",
    "SetResult",
    "StateStoreClient",
    "StateStoreClientError",
    "StatusError",
    "TimestampSkew",
    "UnexpectedResponse",
    "UnknownCommand",
    "WrongNumberOfArguments",
]
