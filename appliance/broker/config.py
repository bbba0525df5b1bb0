"""Schema of the ``[broker]`` section: listeners, limits and authentication."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.broker.acl import AclFileError, parse_pattern
from appliance.config.errors import ConfigError
from appliance.config.fields import get_bool, get_choice, get_int, get_optional_str, get_str, join, reject_unknown, require_table


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    type: str
    host: str
    port: int
    certfile: Path | None = None
    keyfile: Path | None = None
    cafile: Path | None = None
    require_certificate: bool = False


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
    allow_anonymous: bool = True
    password_file: Path | None = None
    acl_file: Path | None = None
    acl_client_patterns: tuple[str, ...] = DEFAULT_ACL_CLIENT_PATTERNS


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

    ``max_inflight_messages`` caps the unacknowledged QoS 1/2 deliveries per client (mosquitto's option of
    that name, default 20 as there; 0: no cap): 3.1.1 has no Receive Maximum, so without it a subscriber
    that never acknowledges would get every queued message. ``max_queued_messages`` bounds the messages
    one client has queued in memory: QoS 0 ones, and QoS 1/2 ones of a non-durable session while it is a
    slow consumer. ``max_queued_bytes`` bounds the payload bytes of a durable session's QoS 1/2 messages,
    which wait in ``broker.db``, not in memory (None: ``queued_bytes_default`` of the free space at
    start; 0: no bound). Past either, messages are dropped and counted; a client that makes progress
    loses none: its publishers are held back instead. ``outbound_buffer_bytes`` is the write-buffer high-water mark past which the publishers
    feeding a client are held back (and, for a stuck client, its QoS 0 dropped); ``sys_interval`` is how
    often ``$SYS`` is republished (0: never). ``max_topic_levels`` and ``max_user_properties`` bound what one
    packet can make the broker build (docs/broker-security.md, "Resource limits")."""

    max_packet_size: int = 4 * 1024 * 1024
    receive_maximum: int = 1024
    max_inflight_messages: int = 20
    max_queued_messages: int = 1000
    max_queued_bytes: int | None = None
    max_keepalive: int = 65535
    topic_alias_maximum: int = 64
    max_session_expiry: int = 0xFFFFFFFF
    outbound_buffer_bytes: int = 1024 * 1024
    sys_interval: int = 10
    max_topic_levels: int = 128
    max_user_properties: int = 64


@dataclass(frozen=True, slots=True)
class PersistenceConfig:
    """``synchronous``: "normal" survives a killed process, "full" also power loss (an fsync per commit)."""

    synchronous: str = "normal"


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    listeners: tuple[ListenerConfig, ...]
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    persistence: PersistenceConfig = field(default_factory=PersistenceConfig)


def _path(raw: Mapping[str, Any], key: str, path: str, base_dir: Path) -> Path | None:
    value = get_optional_str(raw, key, path)
    if value is None:
        return None
    resolved = Path(value)
    return resolved if resolved.is_absolute() else base_dir / resolved


def parse_listener(raw: Any, path: str, base_dir: Path) -> ListenerConfig:
    table = require_table(raw, path)
    reject_unknown(table, path, ("type", "host", "port", "certfile", "keyfile", "cafile", "require_certificate"))
    kind = get_choice(table, "type", path, ("tcp", "tls", "websocket"), "tcp")
    listener = ListenerConfig(
        type=kind,
        host=get_str(table, "host", path, "127.0.0.1"),
        port=get_int(table, "port", path, 8883 if kind == "tls" else 1883, minimum=0, maximum=65535),
        certfile=_path(table, "certfile", path, base_dir),
        keyfile=_path(table, "keyfile", path, base_dir),
        cafile=_path(table, "cafile", path, base_dir),
        require_certificate=get_bool(table, "require_certificate", path, False),
    )
    if kind == "tls" and (listener.certfile is None or listener.keyfile is None):
        raise ConfigError(join(path, "certfile"), "a tls listener needs certfile and keyfile")
    return listener


def parse(raw: Mapping[str, Any], path: str, base_dir: Path) -> BrokerConfig:
    reject_unknown(raw, path, ("listeners", "auth", "limits", "persistence"))
    listeners_raw = raw.get("listeners", [{"type": "tcp", "host": "127.0.0.1", "port": 1883}])
    if not isinstance(listeners_raw, list) or not listeners_raw:
        raise ConfigError(join(path, "listeners"), "expected a non-empty list of listeners")
    listeners = tuple(
        parse_listener(item, join(join(path, "listeners"), index), base_dir) for index, item in enumerate(listeners_raw)
    )
    auth_path = join(path, "auth")
    auth_raw = require_table(raw.get("auth", {}), auth_path)
    reject_unknown(auth_raw, auth_path, ("allow_anonymous", "password_file", "acl_file", "acl_client_patterns"))
    auth = AuthConfig(
        allow_anonymous=get_bool(auth_raw, "allow_anonymous", auth_path, True),
        password_file=_path(auth_raw, "password_file", auth_path, base_dir),
        acl_file=_path(auth_raw, "acl_file", auth_path, base_dir),
        acl_client_patterns=parse_client_patterns(auth_raw, join(auth_path, "acl_client_patterns")),
    )
    return BrokerConfig(
        listeners=listeners,
        auth=auth,
        limits=parse_limits(raw.get("limits", {}), join(path, "limits")),
        persistence=parse_persistence(raw.get("persistence", {}), join(path, "persistence")),
    )


def parse_client_patterns(raw: Mapping[str, Any], path: str) -> tuple[str, ...]:
    """A list of ``[access] filter`` strings, each checked as an ACL file's ``pattern`` line would be."""
    value = raw.get("acl_client_patterns", list(DEFAULT_ACL_CLIENT_PATTERNS))
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(path, "expected a list of strings such as \"readwrite clients/%c/#\"")
    for index, text in enumerate(value):
        try:
            parse_pattern(text)
        except AclFileError as exc:
            raise ConfigError(join(path, index), str(exc).removeprefix("acl_client_patterns: ")) from exc
    return tuple(value)


def parse_persistence(raw: Any, path: str) -> PersistenceConfig:
    table = require_table(raw, path)
    reject_unknown(table, path, ("synchronous",))
    return PersistenceConfig(synchronous=get_choice(table, "synchronous", path, ("normal", "full"), "normal"))


def parse_limits(raw: Any, path: str) -> LimitsConfig:
    table = require_table(raw, path)
    defaults = LimitsConfig()
    reject_unknown(table, path, LimitsConfig.__slots__)
    return LimitsConfig(
        max_packet_size=get_int(table, "max_packet_size", path, defaults.max_packet_size, minimum=64, maximum=268_435_460),
        receive_maximum=get_int(table, "receive_maximum", path, defaults.receive_maximum, minimum=1, maximum=65535),
        max_inflight_messages=get_int(table, "max_inflight_messages", path, defaults.max_inflight_messages, minimum=0, maximum=65535),
        max_queued_messages=get_int(table, "max_queued_messages", path, defaults.max_queued_messages, minimum=0),
        max_queued_bytes=get_int(table, "max_queued_bytes", path, minimum=0) if "max_queued_bytes" in table else None,
        max_keepalive=get_int(table, "max_keepalive", path, defaults.max_keepalive, minimum=1, maximum=65535),
        topic_alias_maximum=get_int(table, "topic_alias_maximum", path, defaults.topic_alias_maximum, minimum=0, maximum=65535),
        max_session_expiry=get_int(table, "max_session_expiry", path, defaults.max_session_expiry, minimum=0, maximum=0xFFFFFFFF),
        outbound_buffer_bytes=get_int(table, "outbound_buffer_bytes", path, defaults.outbound_buffer_bytes, minimum=1024),
        sys_interval=get_int(table, "sys_interval", path, defaults.sys_interval, minimum=0),
        # A 65,535-byte topic has at most 65,536 levels: a larger value would mean no limit at all.
        max_topic_levels=get_int(table, "max_topic_levels", path, defaults.max_topic_levels, minimum=1, maximum=65536),
        max_user_properties=get_int(table, "max_user_properties", path, defaults.max_user_properties, minimum=1,
                                    maximum=65535),
    )
