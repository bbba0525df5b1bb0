"""The firmware service's wire protocol and its request queue, with no I/O.

A thermostat asks for one chunk at a time: a QoS 1 PUBLISH to ``REQUEST_TOPIC`` with a Response Topic and
Correlation Data, payload RESP3 ``CHUNK <version> <file> <offset> <size>``. The reply, on the response topic
with the same correlation data, is a RESP3 bulk string of the file's bytes from ``offset``, at most ``size``
of them (shorter at the end of the file, empty past it), or ``-ERR <why>``. The request names file and
offset, so a transfer resumes wherever it stopped (a lost reply, a gateway restart, a thermostat reboot),
and the requester chooses ``size`` to fit its receive buffer (the gateway caps it at ``MAX_CHUNK``).

``ChunkQueue`` is what keeps the service low priority: bounded, one entry per client (a newer request of
the same client replaces the older one, which its sender has given up on), first in, first out.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

from appliance.broker.request_envelope import Request
from appliance.statestore import resp3

REQUEST_TOPIC = "firmware/v1/command/chunk"
#: The largest chunk served, whatever is asked: a reply must stay one small MQTT message.
MAX_CHUNK = 4096
#: A version or file name: one path component, 1-32 of [A-Za-z0-9._-], not starting with a dot.
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,31}")
#: A thermostat's name (its MQTT client id and key prefix) or a group's: what images/firmware/deploy.py
#: accepts for a thermostat, 1-64 of [A-Za-z0-9._-]. Wider than ``NAME``: it never names a file.
THERMOSTAT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
MANIFEST = "manifest.txt"
SIGNATURE = "manifest.sig"


def desired_key(thermostat: str) -> str:
    """The state store key naming the version one thermostat should run (it wins over its group's)."""
    return f"{thermostat}\\desiredFirmware"


def group_key(group: str) -> str:
    """The state store key listing a group's thermostats (names separated by spaces or commas). Groups live
    on the gateway side: ``firmware publish --group`` writes each member's own key, so a thermostat watches
    one key and its 64 KB heap pays for nothing more."""
    return f"group\\{group}\\thermostats"


def group_members(value: bytes) -> list[str]:
    """The thermostat names in a group key's value; ValueError naming one that is not a name."""
    names = value.decode("utf-8", "replace").replace(",", " ").split()
    for name in names:
        if not THERMOSTAT_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a thermostat name")
    return names


class RequestError(ValueError):
    """A request the service answers with ``-ERR`` (the message is the text)."""


@dataclass(frozen=True, slots=True)
class ChunkRequest:
    version: str
    path: str
    offset: int
    size: int


def _text(value: resp3.Value, what: str) -> str:
    if not isinstance(value, bytes):
        raise RequestError(f"{what} must be a bulk string")
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        raise RequestError(f"{what} is not a name") from None
    if not NAME.fullmatch(text):
        raise RequestError(f"{what} is not a name")
    return text


def _number(value: resp3.Value, what: str, limit: int) -> int:
    if isinstance(value, bytes) and value.isdigit() and len(value) <= 10:
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise RequestError(f"{what} must be a decimal number")
    if not 0 <= number <= limit:
        raise RequestError(f"{what} out of range")
    return number


def parse_request(payload: bytes) -> ChunkRequest:
    """``CHUNK <version> <file> <offset> <size>``, or RequestError saying what is wrong."""
    try:
        value = resp3.decode(payload)
    except resp3.Resp3Error as exc:
        raise RequestError(f"syntax error ({exc})") from None
    if not isinstance(value, list) or not value or not isinstance(value[0], bytes):
        raise RequestError("syntax error")
    if value[0].upper() != b"CHUNK":
        raise RequestError("unknown command")
    if len(value) != 5:
        raise RequestError("wrong number of arguments")
    return ChunkRequest(_text(value[1], "version"), _text(value[2], "file"),
                        _number(value[3], "offset", 2**31), max(1, _number(value[4], "size", 2**31)))


def chunk_reply(data: bytes, request: ChunkRequest) -> bytes:
    """The reply to a request for a file whose bytes are ``data``."""
    size = min(request.size, MAX_CHUNK)
    return resp3.encode_bulk(data[request.offset:request.offset + size])


def error_reply(message: str) -> bytes:
    return resp3.encode_error(message)


@dataclass(frozen=True, slots=True)
class PendingChunk:
    """A request waiting for its turn: who asked and where the answer goes, and what it answers."""

    request: Request
    payload: bytes


class ChunkQueue:
    """Requests waiting to be served: at most ``limit`` clients, one request each, oldest first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._waiting: OrderedDict[str, PendingChunk] = OrderedDict()

    def __len__(self) -> int:
        return len(self._waiting)

    def offer(self, client_id: str, pending: PendingChunk) -> bool:
        """Queue a client's request; False when the queue is full (the client should retry later). A client's
        newer request replaces its older one and keeps its place: one outstanding chunk per client."""
        if client_id in self._waiting:
            self._waiting[client_id] = pending
            return True
        if len(self._waiting) >= self.limit:
            return False
        self._waiting[client_id] = pending
        return True

    def pop(self) -> tuple[str, PendingChunk] | None:
        if not self._waiting:
            return None
        return self._waiting.popitem(last=False)

    def discard(self, client_id: str) -> None:
        self._waiting.pop(client_id, None)
