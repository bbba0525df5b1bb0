"""Schema of the ``[forwarding]`` section (and ``[forwarding.upstream]``).

Each setting is written once, as a field (``appliance.config.schema``); relative paths (manifest, TLS
files) resolve against the configuration file's folder. The generated reference is docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from appliance.config.errors import ConfigError
from appliance.config.schema import join, setting
from appliance.forwarding.validity import string_problem, upstream_problem

DEFAULT_TOPIC_TEMPLATE = "gateways/{gateway_id}/devices/{device_id}/messages/events"
#: ``message_id`` and ``priority`` carry the identity MQTT 3.1.1 cannot send as user properties.
TOPIC_FIELDS = ("gateway_id", "device_id", "module_id", "output", "message_id", "priority")
DEFAULT_BATCH_TOPIC = "gateways/{gateway_id}/batches"
BATCH_TOPIC_FIELDS = ("gateway_id", "priority")
#: "message": one PUBLISH per message with ``gw-*`` user properties; "batch": several per PUBLISH
#: (appliance/forwarding/batch.py). Both in docs/message-format.md.
Format = Literal["message", "batch"]
FORMATS: tuple[str, ...] = get_args(Format)


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    host: str | None = setting(None, doc="the cloud broker; absent: no upstream link, $upstream messages wait in their queues")
    port: int = setting(1883, minimum=1, maximum=65535, doc="the cloud broker's port (8883 is usual with tls)")
    protocol: Literal["5", "3.1.1"] = setting("5", doc="MQTT version spoken upstream")
    tls: bool = setting(False, doc="TLS to the cloud broker, checked against ca_file")
    ca_file: Path | None = setting(None, doc="CA bundle for the upstream's certificate; absent: the system's")
    cert_file: Path | None = setting(None, doc="client certificate (PEM)")
    key_file: Path | None = setting(None, doc="client key (PEM)")
    tls_insecure: bool = setting(False, doc="accept any upstream certificate and host name")
    username: str | None = setting(None, doc="MQTT username upstream")
    password: str | None = setting(None, doc="MQTT password upstream")
    client_id: str | None = setting(None, shown_default="the gateway id", doc="MQTT client id upstream")
    topic_template: str = setting(
        DEFAULT_TOPIC_TEMPLATE, doc="also {module_id}, {output}, {message_id}, {priority} (docs/message-format.md)"
    )
    format: Format = setting("message", doc="batch: several messages per PUBLISH (docs/message-format.md)")
    batch_topic: str = setting(DEFAULT_BATCH_TOPIC, doc="format = batch only; also {priority}")
    batch_max_bytes: int = setting(
        2048, minimum=64, maximum=1 << 24,
        doc="device payload per batch PUBLISH (also capped by the upstream's Maximum Packet Size)",
    )
    keepalive_s: int = setting(30, minimum=1, maximum=65535, doc="MQTT keep-alive upstream")
    backoff_min_s: float = setting(0.5, minimum=0.01, doc="first reconnect delay; doubles, with jitter, up to backoff_max_s")
    backoff_max_s: float = setting(60.0, minimum=0.01, doc=">= backoff_min_s")

    def checked(self, given: Mapping[str, Any], path: str) -> UpstreamConfig:
        _check_template(self.topic_template, TOPIC_FIELDS, join(path, "topic_template"))
        _check_template(self.batch_topic, BATCH_TOPIC_FIELDS, join(path, "batch_topic"))
        if self.host is not None and not self.host.strip():
            raise ConfigError(join(path, "host"), "is empty: leave it out for no upstream link")
        for name, value in (("client_id", self.client_id), ("username", self.username)):
            problem = None if value is None else string_problem(name, value)
            if problem is not None:
                raise ConfigError(join(path, name), problem.detail)
        if self.backoff_max_s < self.backoff_min_s:
            raise ConfigError(join(path, "backoff_max_s"), f"must be >= backoff_min_s ({self.backoff_min_s})")
        return self


def _check_template(template: str, fields: tuple[str, ...], path: str) -> None:
    """Format the template once with every field it may use: a typo fails here, not at the first message.
    The result must be a topic a conforming server accepts (no wildcard, no control character): else
    every message would be unsendable and go to the dead letters."""
    try:
        topic = template.format(**{name: "x" for name in fields})
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise ConfigError(path, f"fields are {', '.join('{' + f + '}' for f in fields)}: {exc}") from exc
    problem = upstream_problem(topic, (), None, 0, None)
    if problem is not None:
        raise ConfigError(path, problem.detail)


@dataclass(frozen=True, slots=True)
class ForwardingConfig:
    enabled: bool = setting(False, doc="run the routes of the manifest (store-and-forward)")
    manifest: Path | None = setting(None, doc="the $edgeHub desired properties (routes, TTL); re-read when it changes")
    watch_interval_s: float = setting(1.0, minimum=0.05, doc="how often the manifest file's mtime is checked")
    max_store_bytes: int | None = setting(None, minimum=4096, doc="bound on stored bodies + headers; absent: unbounded")
    check_entire_queue_on_cleanup: bool = setting(True, doc="the cleanup scans whole queues, not only their heads")
    cleanup_interval_s: float = setting(30.0, minimum=0.05, doc="how often expired messages are removed")
    max_link_drops: int = setting(
        3, minimum=1, maximum=1000,
        doc="a message alone in flight when the upstream link drops this many times goes to the dead letters",
    )
    metrics_interval_s: float = setting(
        60.0, minimum=0.1, doc="$SYS/gateway/forwarding/metrics and gateways/{id}/metrics upstream"
    )
    upstream: UpstreamConfig = setting(factory=UpstreamConfig)
