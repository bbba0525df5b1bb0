"""Schema of the ``[forwarding]`` section (and ``[forwarding.upstream]``).

Relative paths (manifest, TLS files) resolve against the configuration file's folder. Errors name the
field path (``forwarding.upstream.port``) through ``appliance.config.fields``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.config.errors import ConfigError
from appliance.config.fields import (
    get_bool,
    get_choice,
    get_float,
    get_int,
    get_optional_str,
    get_str,
    join,
    reject_unknown,
    require_table,
)

DEFAULT_TOPIC_TEMPLATE = "gateways/{gateway_id}/devices/{device_id}/messages/events"
#: ``message_id`` and ``priority`` carry the identity MQTT 3.1.1 cannot send as user properties.
TOPIC_FIELDS = ("gateway_id", "device_id", "module_id", "output", "message_id", "priority")
DEFAULT_BATCH_TOPIC = "gateways/{gateway_id}/batches"
BATCH_TOPIC_FIELDS = ("gateway_id", "priority")
#: "message": one PUBLISH per message with ``gw-*`` user properties; "batch": several per PUBLISH
#: (appliance/forwarding/batch.py). Both in docs/message-format.md.
FORMATS = ("message", "batch")


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    host: str | None = None  # None: no upstream link; messages for $upstream wait in their queues
    port: int = 1883
    protocol: str = "5"  # "5" or "3.1.1"
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    tls_insecure: bool = False
    username: str | None = None
    password: str | None = None
    client_id: str | None = None  # default: the gateway id
    topic_template: str = DEFAULT_TOPIC_TEMPLATE
    format: str = "message"
    batch_topic: str = DEFAULT_BATCH_TOPIC
    batch_max_bytes: int = 2048  # device payload per batch PUBLISH
    keepalive_s: int = 30
    backoff_min_s: float = 0.5
    backoff_max_s: float = 60.0


@dataclass(frozen=True, slots=True)
class ForwardingConfig:
    enabled: bool = False
    manifest: Path | None = None
    watch_interval_s: float = 1.0
    max_store_bytes: int | None = None
    check_entire_queue_on_cleanup: bool = True
    cleanup_interval_s: float = 30.0
    metrics_interval_s: float = 60.0
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)


def _path(raw: Mapping[str, Any], key: str, path: str, base_dir: Path) -> Path | None:
    value = get_optional_str(raw, key, path)
    if value is None:
        return None
    file = Path(value)
    return file if file.is_absolute() else base_dir / file


def _template(raw: Mapping[str, Any], key: str, path: str, default: str, fields: tuple[str, ...]) -> str:
    template = get_str(raw, key, path, default)
    try:
        template.format(**{name: "x" for name in fields})
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(join(path, key), f"fields are {', '.join('{' + f + '}' for f in fields)}: {exc}") from exc
    return template


def parse_upstream(raw: Mapping[str, Any], path: str, base_dir: Path) -> UpstreamConfig:
    reject_unknown(raw, path, UpstreamConfig.__dataclass_fields__)
    template = _template(raw, "topic_template", path, DEFAULT_TOPIC_TEMPLATE, TOPIC_FIELDS)
    batch_topic = _template(raw, "batch_topic", path, DEFAULT_BATCH_TOPIC, BATCH_TOPIC_FIELDS)
    backoff_min = get_float(raw, "backoff_min_s", path, 0.5, minimum=0.01)
    backoff_max = get_float(raw, "backoff_max_s", path, 60.0, minimum=0.01)
    if backoff_max < backoff_min:
        raise ConfigError(join(path, "backoff_max_s"), f"must be >= backoff_min_s ({backoff_min})")
    return UpstreamConfig(
        host=get_optional_str(raw, "host", path),
        port=get_int(raw, "port", path, 1883, minimum=1, maximum=65535),
        protocol=get_choice(raw, "protocol", path, ("5", "3.1.1"), "5"),
        tls=get_bool(raw, "tls", path, False),
        ca_file=_path(raw, "ca_file", path, base_dir),
        cert_file=_path(raw, "cert_file", path, base_dir),
        key_file=_path(raw, "key_file", path, base_dir),
        tls_insecure=get_bool(raw, "tls_insecure", path, False),
        username=get_optional_str(raw, "username", path),
        password=get_optional_str(raw, "password", path),
        client_id=get_optional_str(raw, "client_id", path),
        topic_template=template,
        format=get_choice(raw, "format", path, FORMATS, "message"),
        batch_topic=batch_topic,
        batch_max_bytes=get_int(raw, "batch_max_bytes", path, 2048, minimum=64, maximum=1 << 24),
        keepalive_s=get_int(raw, "keepalive_s", path, 30, minimum=1, maximum=65535),
        backoff_min_s=backoff_min,
        backoff_max_s=backoff_max,
    )


def parse(raw: Mapping[str, Any], path: str, base_dir: Path) -> ForwardingConfig:
    reject_unknown(raw, path, ForwardingConfig.__dataclass_fields__)
    max_store = raw.get("max_store_bytes")
    return ForwardingConfig(
        enabled=get_bool(raw, "enabled", path, False),
        manifest=_path(raw, "manifest", path, base_dir),
        watch_interval_s=get_float(raw, "watch_interval_s", path, 1.0, minimum=0.05),
        max_store_bytes=None if max_store is None else get_int(raw, "max_store_bytes", path, minimum=4096),
        check_entire_queue_on_cleanup=get_bool(raw, "check_entire_queue_on_cleanup", path, True),
        cleanup_interval_s=get_float(raw, "cleanup_interval_s", path, 30.0, minimum=0.05),
        metrics_interval_s=get_float(raw, "metrics_interval_s", path, 60.0, minimum=0.1),
        upstream=parse_upstream(require_table(raw.get("upstream", {}), join(path, "upstream")), join(path, "upstream"), base_dir),
    )
