"""Each request, built once for both faces: a ``Call`` is the RESP3 payload, its user properties (the
fencing token) and the function that reads the answer. ``StateStoreClient.call`` waits for it blocking,
``AsyncStateStoreClient.call`` awaits it; neither builds a request of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from appliance.statestore.client.results import (
    DeleteResult,
    GetResult,
    RawResponse,
    SetResult,
    delete_result,
    get_result,
    keynotify_result,
    set_result,
)
from appliance.statestore.commands import (
    Condition,
    DelCommand,
    GetCommand,
    KeyNotifyCommand,
    SetCommand,
    VDelCommand,
)
from appliance.statestore.hlc import Hlc

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    payload: bytes
    read: Callable[[RawResponse], T]
    user_properties: list[tuple[str, str]] = field(default_factory=list)


def as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def fencing(token: Hlc | None) -> list[tuple[str, str]]:
    return [("__ft", str(token))] if token is not None else []


def set_(
    key: bytes | str, value: bytes | str, condition: Condition, expire_ms: int | None, fencing_token: Hlc | None
) -> Call[SetResult]:
    command = SetCommand(as_bytes(key), as_bytes(value), condition, expire_ms)
    return Call(command.encode(), set_result, fencing(fencing_token))


def get(key: bytes | str) -> Call[GetResult]:
    return Call(GetCommand(as_bytes(key)).encode(), get_result)


def delete(key: bytes | str, fencing_token: Hlc | None) -> Call[DeleteResult]:
    return Call(DelCommand(as_bytes(key)).encode(), delete_result, fencing(fencing_token))


def vdelete(key: bytes | str, value: bytes | str, fencing_token: Hlc | None) -> Call[DeleteResult]:
    return Call(VDelCommand(as_bytes(key), as_bytes(value)).encode(), delete_result, fencing(fencing_token))


def keynotify(key: bytes, *, stop: bool = False) -> Call[bool]:
    return Call(KeyNotifyCommand(key, stop=stop).encode(), keynotify_result)
