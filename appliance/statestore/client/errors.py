"""What can go wrong with a request, as exception classes: every ``-ERR`` string of the protocol has its
own (so callers can catch ``FencingTokenLower`` rather than compare text), an unknown one is a plain
``ServiceError`` carrying the text, and envelope failures (status, protocol version, PUBACK reason) have
theirs."""

from __future__ import annotations

from appliance.statestore import errors
from appliance.statestore.protocol import supported_protocol_version


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


def status_failure(properties: dict[str, str]) -> StateStoreClientError | None:
    """What the SDK invokers check before the payload: the response's protocol version, then its status."""
    version = properties.get("__protVer")
    if not supported_protocol_version(version):
        return UnexpectedResponse(f"response protocol version {version!r} is not supported")
    status = properties.get("__stat", "200")
    if not status.isdigit() or int(status) >= 400:
        return StatusError(status, properties.get("__stMsg", ""))
    return None

