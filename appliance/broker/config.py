"""Schema of the ``[broker]`` section: listeners, limits and authentication.

Each setting is written once, as a field (``appliance.config.schema``); the rules between fields are the
sections' ``checked`` methods. The generated reference is docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from appliance.broker.security.acl import AclFileError, parse_pattern
from appliance.config.errors import ConfigError
from appliance.config.schema import join, setting


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    type: Literal["tcp", "tls", "websocket"] = setting("tcp", doc="websocket: MQTT over WebSocket; with certfile, wss")
    host: str = setting("127.0.0.1", doc="address to bind")
    port: int = setting(1883, minimum=0, maximum=65535, doc="0: any free port; default 8883 for tls")
    certfile: Path | None = setting(None, doc="PEM certificate chain; required for tls")
    keyfile: Path | None = setting(None, doc="PEM private key; required for tls")
    cafile: Path | None = setting(None, doc="CA bundle that client certificates must chain to")
    require_certificate: bool = setting(False, doc="refuse TLS clients without a certificate signed by cafile")

    def checked(self, given: Mapping[str, Any], path: str) -> ListenerConfig:
        if self.type == "tls" and (self.certfile is None or self.keyfile is None):
            raise ConfigError(join(path, "certfile"), "a tls listener needs certfile and keyfile")
        if self.type == "tls" and "port" not in given:
            return dataclasses.replace(self, port=8883)
        return self


#: Patterns added to every ACL file (docs/broker-security.md): each client's own ``clients/<client id>/``
#: topics (the request/response prefix of the state store SDKs: Rust, .NET and our client use the id,
#: the Go SDK its upper-case hex) and its state store notification topics. The state store answers only
#: on topics the requester may write, so these make the SDKs work under any ACL file, and nothing else.
DEFAULT_ACL_CLIENT_PATTERNS = (
    "readwrite clients/%c/#",
    "readwrite clients/%x/#",
    "readwrite clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/%x/command/notify/#",
)


@dataclass(frozen=True, slots=True)
class AuthConfig:
    allow_anonymous: bool = setting(True, doc="clients without a username (or, with no password_file, any) may connect")
    password_file: Path | None = setting(None, doc="mosquitto_passwd format ($7$ PBKDF2, $6$)")
    acl_file: Path | None = setting(None, doc="mosquitto ACL format; absent: every client may use every topic")
    acl_client_patterns: tuple[str, ...] = setting(
        DEFAULT_ACL_CLIENT_PATTERNS, doc="[access] filter patterns added after the acl_file's own (docs/broker-security.md)"
    )

    def checked(self, given: Mapping[str, Any], path: str) -> AuthConfig:
        """Each pattern is checked as an ACL file's ``pattern`` line would be."""
        for index, text in enumerate(self.acl_client_patterns):
            try:
                parse_pattern(text)
            except AclFileError as exc:
                raise ConfigError(join(join(path, "acl_client_patterns"), index), str(exc).removeprefix("acl_client_patterns: ")) from exc
        return self


#: ``max_queued_bytes`` when not configured: min(this, QUEUED_BYTES_SHARE of the data directory's free
#: space when the gateway starts) per durable session (``queued_bytes_default``).
DEFAULT_QUEUED_BYTES_CAP = 1024 * 1024 * 1024
QUEUED_BYTES_SHARE = 0.25


def queued_bytes_default(free_bytes: int) -> int:
    """The default bound of one durable session's stored deliveries: large enough that an away client
    loses nothing in any ordinary outage (1 GiB is 250,000 messages of 4 KB), small enough that one
    session cannot fill the disk under the others (a quarter of what is free)."""
    return max(1, min(DEFAULT_QUEUED_BYTES_CAP, int(free_bytes * QUEUED_BYTES_SHARE)))


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """Per-client limits (docs/broker.md).

    ``max_inflight_messages`` is mosquitto's option of that name (default 20 as there): 3.1.1 has no
    Receive Maximum, so without it a subscriber that never acknowledges would get every queued message.
    A durable session's QoS 1/2 messages wait in ``broker.db``, bounded by ``max_queued_bytes``; what
    waits in memory is bounded by ``max_queued_messages``. A client that makes progress loses no QoS 1/2
    message to either bound: its publishers are held back instead. ``max_topic_levels`` and
    ``max_user_properties`` bound what one packet can make the broker build (docs/broker-security.md,
    "Resource limits")."""

    max_packet_size: int = setting(
        4 * 1024 * 1024, minimum=64, maximum=268_435_460,
        doc="largest packet accepted (bigger: DISCONNECT 0x95); announced in CONNACK",
    )
    receive_maximum: int = setting(
        1024, minimum=1, maximum=65535,
        doc="unacknowledged inbound QoS 2 messages per client (more: DISCONNECT 0x93); announced in CONNACK",
    )
    max_inflight_messages: int = setting(
        20, minimum=0, maximum=65535,
        doc="unacknowledged outbound QoS 1/2 deliveries per client (MQTT 5: min(Receive Maximum, this)); 0: no cap",
    )
    max_queued_messages: int = setting(
        1000, minimum=0,
        doc="messages queued in memory per client: QoS 0 while it is away or its window is full; QoS 1/2 of a"
        " non-durable slow consumer (more, or more than 8 MiB of payload, are dropped and counted)",
    )
    max_queued_bytes: int | None = setting(
        None, minimum=0, shown_default="min(1 GiB, 25 % of the data dir's free space at start)",
        doc="payload bytes of one durable session's QoS 1/2 messages in broker.db (more are dropped, counted,"
        " MQTT 5 publishers get 0x97); absent: queued_bytes_default of the free space; 0: no bound",
    )
    max_keepalive: int = setting(
        65535, minimum=1, maximum=65535, doc="larger keep-alives are cut to this (MQTT 5: Server Keep Alive in CONNACK)"
    )
    topic_alias_maximum: int = setting(
        64, minimum=0, maximum=65535, doc="inbound topic aliases per connection; announced in CONNACK"
    )
    max_session_expiry: int = setting(
        0xFFFFFFFF, minimum=0, maximum=0xFFFFFFFF, doc="cap on a client's session expiry interval"
    )
    outbound_buffer_bytes: int = setting(
        1024 * 1024, minimum=1024,
        doc="socket write buffer high-water mark past which the publishers feeding a client are held back"
        " (for a stuck client, its QoS 0 dropped)",
    )
    sys_interval: int = setting(10, minimum=0, doc="seconds between $SYS updates (0: none)")
    # A 65,535-byte topic has at most 65,536 levels: a larger value would mean no limit at all.
    max_topic_levels: int = setting(
        128, minimum=1, maximum=65536,
        doc="levels in a topic filter (deeper: SUBACK 0x8F, 3.1.1: 0x80) or topic name (PUBLISH: DISCONNECT 0x90,"
        " will: CONNACK 0x90; 3.1.1: closed)",
    )
    max_user_properties: int = setting(
        64, minimum=1, maximum=65535,
        doc="user properties (and subscription identifiers) in one packet's property block (more: DISCONNECT 0x97,"
        " CONNECT: CONNACK 0x97)",
    )


@dataclass(frozen=True, slots=True)
class PersistenceConfig:
    synchronous: Literal["normal", "full"] = setting(
        "normal", doc="broker.db: normal survives a killed process, full also power loss (an fsync per commit)"
    )


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    listeners: tuple[ListenerConfig, ...] = setting(
        (ListenerConfig(),), minimum=1, shown_default="tcp on 127.0.0.1:1883",
        doc="[[broker.listeners]] tables; --listen HOST:PORT replaces them with one tcp listener",
    )
    auth: AuthConfig = setting(factory=AuthConfig)
    limits: LimitsConfig = setting(factory=LimitsConfig)
    persistence: PersistenceConfig = setting(factory=PersistenceConfig)
