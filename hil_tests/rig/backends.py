"""What the rig program needs from a backend, and the userspace backend (the relay behind that interface).

The rig program talks to `Backend` only, so the serial protocol behaves the same whichever way the link is
shaped; each backend declares the features it really carries out and STATUS reports exactly those.
"""

from __future__ import annotations

from typing import Protocol

from hil_tests.rig.relay import Relay
from hil_tests.rig.shaping import LinkSettings


class Backend(Protocol):
    name: str
    features: frozenset[str]
    # True once `start` found and undid what a rig that did not stop left (STATUS ``restarted=1``).
    restarted: bool

    async def start(self) -> None: ...

    async def apply(self, settings: LinkSettings) -> None:
        """Make the link match ``settings``; raise (with a reason) and keep the old settings on failure."""

    def details(self) -> dict[str, str]:
        """Endpoints and counters for STATUS and the ready line; values must not contain spaces."""

    async def close(self) -> None: ...


class UserspaceBackend:
    """The relay: the gateway connects to ``listen``, the relay connects on to the cloud endpoint."""

    name = "userspace"
    features = frozenset({"rate", "delay", "jitter", "loss", "down"})
    restarted = False  # it changes nothing outside its own process

    def __init__(
        self, target_host: str, target_port: int, listen_host: str = "127.0.0.1", listen_port: int = 0
    ) -> None:
        self.relay = Relay(target_host, target_port, listen_host=listen_host, listen_port=listen_port)

    async def start(self) -> None:
        await self.relay.start()

    async def apply(self, settings: LinkSettings) -> None:
        self.relay.apply(settings)

    def details(self) -> dict[str, str]:
        stats = self.relay.stats()
        return {
            "listen": f"{self.relay.host}:{self.relay.port}",
            "target": f"{self.relay.target_host}:{self.relay.target_port}",
            "bytes_up": str(stats.upstream.bytes_forwarded),
            "bytes_down": str(stats.downstream.bytes_forwarded),
            "bps_up": str(round(stats.upstream.throughput_bps)),
            "bps_down": str(round(stats.downstream.throughput_bps)),
            "connections": str(stats.connections_open),
        }

    async def close(self) -> None:
        await self.relay.stop()
