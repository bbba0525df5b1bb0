"""KEYNOTIFY: who watches which key, where notifications go, and what they say.

Registrations are per (client id, key) and live only in memory: the protocol says they vanish when the
client disconnects, so persisting them would only resurrect registrations nobody expects. The index is
kept both ways (key -> clients for fan-out, client -> keys for dropping a client in O(its keys)), with
the user name the client connected with, so the service can check the broker ACL for that client at each
notification. Because they are memory held for as long as the client stays connected, and a key can be as
long as a packet, a client holds at most ``MAX_REGISTRATIONS_PER_CLIENT`` of them and
``MAX_REGISTERED_KEY_BYTES_PER_CLIENT`` of their keys (docs/statestore.md): past either, ``register``
refuses (``-ERR the quota has been exceeded``) and the client's other registrations stay.

The topic is ``clients/statestore/v1/<system id>/{HEX(clientId)}/command/notify/{HEX(key)}`` with RFC 4648
base16 (upper case). Payloads are ``NOTIFY SET VALUE <v>`` and ``NOTIFY DELETE`` - the latter is what the
SDK clients parse, where the protocol document says ``DEL``.

Pure: the service turns ``WatcherNotification`` objects into broker publishes, in change order.
"""

from __future__ import annotations

import base64
from collections import defaultdict
from dataclasses import dataclass

from appliance.statestore import resp3
from appliance.statestore.store import Change

SYSTEM_ID = "FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8"
NOTIFY_TOPIC_PREFIX = f"clients/statestore/v1/{SYSTEM_ID}"
#: KEYNOTIFY registrations one client may hold: far above what an application watches, and what keeps
#: one connection registering distinct keys from growing the gateway's memory without end.
MAX_REGISTRATIONS_PER_CLIENT = 1024
#: ... and the bytes of their keys (a key can be as long as a packet).
MAX_REGISTERED_KEY_BYTES_PER_CLIENT = 64 * 1024


def notification_topic(client_id: str, key: bytes) -> str:
    client_hex = base64.b16encode(client_id.encode("utf-8")).decode("ascii")
    key_hex = base64.b16encode(key).decode("ascii")
    return f"{NOTIFY_TOPIC_PREFIX}/{client_hex}/command/notify/{key_hex}"


def notification_payload(change: Change) -> bytes:
    if change.value is None:
        return resp3.encode_array([b"NOTIFY", b"DELETE"])
    return resp3.encode_array([b"NOTIFY", b"SET", b"VALUE", change.value])


@dataclass(frozen=True, slots=True)
class WatcherNotification:
    client_id: str
    username: str | None
    topic: str
    payload: bytes
    version: str


class NotificationRegistry:
    def __init__(self) -> None:
        self._by_key: dict[bytes, set[str]] = defaultdict(set)
        self._by_client: dict[str, set[bytes]] = defaultdict(set)
        self._usernames: dict[str, str | None] = {}
        #: Client id -> the bytes of the keys it is registered for (``MAX_REGISTERED_KEY_BYTES_PER_CLIENT``).
        self._key_bytes: dict[str, int] = {}

    def register(self, client_id: str, key: bytes, username: str | None = None) -> bool:
        """Idempotent: registering twice is one registration (one notification per change). False, with
        nothing changed, if a new registration would pass the client's quota."""
        keys = self._by_client.get(client_id)
        if keys is None or key not in keys:
            held = self._key_bytes.get(client_id, 0)
            if (keys is not None and len(keys) >= MAX_REGISTRATIONS_PER_CLIENT) \
                    or held + len(key) > MAX_REGISTERED_KEY_BYTES_PER_CLIENT:
                return False
            self._key_bytes[client_id] = held + len(key)
        self._by_key[key].add(client_id)
        self._by_client[client_id].add(key)
        self._usernames[client_id] = username
        return True

    def unregister(self, client_id: str, key: bytes) -> bool:
        """True if there was a registration to remove (``+OK``), False otherwise (``:0``)."""
        keys = self._by_client.get(client_id)
        if not keys or key not in keys:
            return False
        keys.discard(key)
        self._key_bytes[client_id] -= len(key)
        if not keys:
            del self._by_client[client_id]
            del self._usernames[client_id]
            del self._key_bytes[client_id]
        self._discard_client_from_key(key, client_id)
        return True

    def drop_client(self, client_id: str) -> None:
        self._usernames.pop(client_id, None)
        self._key_bytes.pop(client_id, None)
        for key in self._by_client.pop(client_id, ()):
            self._discard_client_from_key(key, client_id)

    def is_registered(self, client_id: str, key: bytes) -> bool:
        return key in self._by_client.get(client_id, ())

    def notifications(self, change: Change) -> list[WatcherNotification]:
        """One notification per registered client, in a stable (sorted) client order."""
        clients = self._by_key.get(change.key)
        if not clients:
            return []
        payload = notification_payload(change)
        version = str(change.version)
        return [
            WatcherNotification(client, self._usernames.get(client), notification_topic(client, change.key), payload, version)
            for client in sorted(clients)
        ]

    def _discard_client_from_key(self, key: bytes, client_id: str) -> None:
        clients = self._by_key.get(key)
        if clients is not None:
            clients.discard(client_id)
            if not clients:
                del self._by_key[key]
