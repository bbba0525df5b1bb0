"""The gateway's ``gw-*`` identity of an upstream message (docs/message-format.md), in one place.

The one-message format sends it as MQTT 5 user properties; a batch carries the same facts in its header,
source table and records, and whoever unpacks a batch (the cloud ingest, the HIL bench) rebuilds exactly
this list from them - so a message looks the same to the cloud whichever format brought it. Pure.
"""

from __future__ import annotations


def gateway_properties(
    message_id: str,
    gateway_id: str,
    device_id: str,
    module_id: str | None,
    output: str | None,
    priority: int,
    enqueued_ms: int,
    sent_ms: int,
    ttl_s: int,
) -> list[tuple[str, str]]:
    """The ``gw-*`` properties in their documented order; module and output only when there is one."""
    props = [("gw-message-id", message_id), ("gw-gateway-id", gateway_id), ("gw-device-id", device_id)]
    if module_id:
        props.append(("gw-module-id", module_id))
    if output:
        props.append(("gw-output", output))
    return props + [
        ("gw-priority", str(priority)),
        ("gw-enqueued-ms", str(enqueued_ms)),
        ("gw-sent-ms", str(sent_ms)),
        ("gw-ttl-s", str(ttl_s)),
    ]
