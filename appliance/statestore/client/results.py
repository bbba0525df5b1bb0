"""Responses and what they mean: the ``RawResponse`` and the typed result of each command, read the way
the SDK clients read them (``-1`` for a SET whose condition failed, ``:0`` for a KEYNOTIFY STOP of a key
that was not watched)."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.statestore import resp3
from appliance.statestore.client.errors import ERROR_CLASSES, ServiceError, UnexpectedResponse
from appliance.statestore.hlc import Hlc, HlcFormatError


@dataclass(frozen=True, slots=True)
class RawResponse:
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


def raise_for_error(response: RawResponse) -> None:
    """An ``-ERR`` reply raised as its exception class (``ServiceError`` with the text for an unknown one)."""
    if isinstance(response.value, resp3.ErrorReply):
        text = response.value.text.decode("utf-8", "replace")
        message = text[4:] if text.startswith("ERR ") else text
        raise ERROR_CLASSES.get(message, ServiceError)(message)


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


def set_result(response: RawResponse) -> SetResult:
    raise_for_error(response)
    if response.value == resp3.SimpleString(b"OK"):
        return SetResult(True, response.version)
    if response.value == -1:
        return SetResult(False, response.version)
    raise UnexpectedResponse(f"SET answered {response.payload!r}")


def get_result(response: RawResponse) -> GetResult:
    raise_for_error(response)
    if response.value is None or isinstance(response.value, bytes):
        return GetResult(response.value, response.version)
    raise UnexpectedResponse(f"GET answered {response.payload!r}")


def delete_result(response: RawResponse) -> DeleteResult:
    raise_for_error(response)
    if isinstance(response.value, int):
        return DeleteResult(response.value, response.version)
    raise UnexpectedResponse(f"DEL/VDEL answered {response.payload!r}")


def keynotify_result(response: RawResponse) -> bool:
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
