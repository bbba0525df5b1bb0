"""The contract between the broker and the services that live inside its process.

The state store and the store-and-forward pipeline are *implicit subscribers*: they see publishes on the
topics they claim before the broker acknowledges them, and they publish responses and notifications back
through the broker without a network hop. Keeping this contract in one small module lets each service be
built and tested without knowing how sessions, the codec or the socket layer work.

Ordering and durability rules a service can rely on:

* ``on_publish`` is awaited before the PUBACK/PUBREC for a QoS 1/2 message is sent, so a service that
  commits to disk inside it gets "acknowledged means durable" for free. Its verdict's reason code is what the
  publisher sees in the PUBACK/PUBREC (MQTT 5) - for MQTT 3.1.1 a failure reason closes nothing, the
  broker just acknowledges (3.1.1 has no way to say no).
* Calls for one client arrive in that client's publish order.
* ``BrokerHandle.publish`` only enqueues: it never blocks and never awaits the network, so a service can
  call it from inside ``on_publish`` and messages it publishes reach subscribers in call order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class InboundPublish:
    """A publish from a connected client, as a service sees it (topic alias already resolved)."""

    client_id: str
    username: str | None
    protocol_level: int  # 4 = MQTT 3.1.1, 5 = MQTT 5
    topic: str
    payload: bytes
    qos: int
    retain: bool
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    message_expiry_interval: int | None = None
    payload_format_indicator: int | None = None


@dataclass(slots=True)
class PublishVerdict:
    """What a service says about an inbound publish.

    ``reason_code`` goes into the MQTT 5 PUBACK/PUBREC (0 = success, >= 0x80 failure). ``disconnect``, when
    set, is the reason code of a DISCONNECT the broker sends before closing the publisher's connection.
    ``route`` False keeps the message from ordinary subscribers (the service consumed it).
    """

    reason_code: int = 0
    reason_string: str | None = None
    disconnect: int | None = None
    route: bool = True


ACCEPTED = PublishVerdict()


class BrokerHandle(Protocol):
    """What a service may ask of the broker."""

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        *,
        user_properties: list[tuple[str, str]] | None = None,
        content_type: str | None = None,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        message_expiry_interval: int | None = None,
        payload_format_indicator: int | None = None,
    ) -> None:
        """Route a message from the broker itself to matching subscribers (and retain it if asked)."""

    def disconnect(self, client_id: str, reason_code: int, reason_string: str | None = None) -> None:
        """Close a client's connection (MQTT 5: DISCONNECT with ``reason_code`` first)."""


class BrokerService(Protocol):
    """A component that lives inside the broker, such as the state store."""

    #: Topic filters (MQTT wildcard syntax) whose publishes go to ``on_publish``.
    topic_filters: tuple[str, ...]

    async def start(self, broker: BrokerHandle) -> None:
        """Called once the broker's stores are open, before listeners accept clients."""

    async def on_publish(self, message: InboundPublish) -> PublishVerdict:
        """Handle a publish on one of ``topic_filters``; awaited before the publisher's acknowledgement."""

    def on_client_disconnected(self, client_id: str) -> None:
        """The client's network connection ended (normally or not); its session may live on."""

    async def stop(self) -> None:
        """Called on shutdown after listeners have closed."""
