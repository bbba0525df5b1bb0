"""The seam between the broker core and the socket layer, both ways.

``Link`` is what the broker needs from the socket layer for one connection (``server.ClientProtocol`` in
production, the fake client of ``tests/broker/pair.py`` in tests); ``BrokerCore`` is what the socket layer
tells the core (``broker.Broker``). Their own module, so the handler modules can name a connection without
importing the socket layer, and the socket layer reaches the core without importing it."""

from __future__ import annotations

from typing import Protocol

from appliance.broker.config import LimitsConfig
from appliance.broker.sessions.session import ClientConnection


class Link(Protocol):
    connection: ClientConnection

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def hold_reading(self, reason: str, held: bool) -> None:
        """Stop (or resume) reading for one named reason; reading resumes when no reason is left."""

    def peer_closed(self) -> bool:
        """Whether the client has closed its side, even while reading is held (when the connection would
        only notice once it reads again): a waiting password check of a client that left is skipped."""

    def unread_input(self) -> bool:
        """Whether bytes from the client wait unread in the socket (reading held: the broker holds it back
        for a congested subscriber, its own socket is congested, or its packets wait for a service): it
        sent something, so it is not silent for its keep-alive, whatever the broker has read."""


class BrokerCore(Protocol):
    """What the socket layer tells the broker core about its connections, and the limits it reads."""

    @property
    def limits(self) -> LimitsConfig: ...

    def connection_made(self, link: Link) -> None: ...

    def data_received(self, link: Link, data: bytes) -> int:
        """Bytes read from ``link``; how many packets they completed."""

    def connection_lost(self, link: Link) -> None: ...

    def congestion_changed(self, link: Link, congested: bool) -> None: ...
