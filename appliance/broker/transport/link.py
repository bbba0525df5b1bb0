"""What the broker needs from the socket layer for one connection (``server.ClientProtocol`` in
production, the fake client of ``tests/broker/pair.py`` in tests). Its own module so the handler
modules can name it without importing the socket layer."""

from __future__ import annotations

from typing import Protocol

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
