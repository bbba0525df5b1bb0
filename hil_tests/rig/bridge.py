"""The bridge backend: the rig box between a real gateway and its uplink, shaping two interfaces it is given.

A rig box (a Raspberry Pi with a USB Ethernet adapter, docs/hil.md) has one port cabled to the gateway's
uplink and one to the uplink side (the modem's Ethernet or the lab network). The backend bridges the two,
so the gateway sees an ordinary, if bad, cable: nothing on the gateway side changes. It never creates or
deletes the ports themselves, only the bridge (or it reuses one that exists), so the same code runs on
physical NICs and on the veth ends the tests hand it.

* rate: ``tc tbf`` on the egress of *each* port. A frame crosses the bridge from one port and leaves by the
  other, so gateway -> uplink is shaped on the uplink port's egress and uplink -> gateway on the gateway
  port's: each direction has an egress of its own and no ifb device is needed. Lowering the burst below the
  old one re-creates the qdisc (dropping what it holds, as a modem that re-negotiates does): tbf stalls for
  good on a queued packet larger than its new burst, and GRO on a physical port makes such packets.
* loss and DOWN: an nftables ``bridge`` table drops frames arriving on either port, in the ``forward`` hook
  (bridged traffic) and the ``input`` hook (traffic to the rig's own relay). Real frames are lost, so the
  gateway's TCP really retransmits.
* delay and jitter need netem. Where the kernel has no ``sch_netem`` (this one: CONFIG_NET_SCH_NETEM is not
  set), they are done as on the netns backend, by the userspace relay: given ``address`` (put on the
  bridge) and ``target`` (the cloud endpoint as the rig reaches it), the relay listens on the bridge's
  address and the gateway's uplink connects to it (``relay`` in STATUS). Rate, loss and DOWN stay in the
  kernel, on the same ports, for the relay's traffic too.

`close()` undoes exactly what `start()` and `apply()` did (qdiscs, table, ports released from the bridge,
the bridge or the address it created), also after a failed start, and leaves the ports up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
from collections.abc import Coroutine
from typing import Any

from hil_tests.rig.kernel import (
    DEFAULT_QUEUE_SECONDS,
    BackendError,
    KernelShaping,
    delete_table,
    drop_rules,
    run_command,
    tbf_arguments,
)
from hil_tests.rig.relay import Relay
from hil_tests.rig.shaping import LinkSettings

DEFAULT_BRIDGE = "hilbr0"
# Interface names as the rig accepts them: they go into nft scripts and tc/ip arguments, and the kernel
# itself allows quotes and braces in a name, which would change an nft script's meaning.
INTERFACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,14}")
NFT_FAMILY = "bridge"
NFT_HOOKS = ("forward", "input")


class BridgeBackend(KernelShaping):
    """Bridges ``ports`` (gateway side, uplink side) and makes their egress qdiscs and drop rules match."""

    name = "bridge"

    def __init__(
        self,
        ports: tuple[str, str],
        bridge: str = DEFAULT_BRIDGE,
        address: str | None = None,
        target: tuple[str, int] | None = None,
        relay_port: int = 0,
        queue_s: float = DEFAULT_QUEUE_SECONDS,
    ) -> None:
        """``ports``: two existing interfaces, gateway side first. ``address`` (CIDR) goes on the bridge for
        the relay; ``target`` enables DELAY/JITTER through that relay and needs ``address``."""
        if len(ports) != 2 or ports[0] == ports[1]:
            raise ValueError(f"the bridge backend needs two different ports, got {','.join(ports)}")
        for name in (*ports, bridge):
            if not INTERFACE_NAME.fullmatch(name):
                raise ValueError(f"not an interface name the rig accepts (letters, digits, _.@-, at most 15): {name!r}")
        if bridge in ports:
            raise ValueError(f"the bridge {bridge!r} cannot also be one of its ports")
        if target is not None and address is None:
            raise ValueError("--target on the bridge backend needs --address: the relay listens on the bridge")
        self.ports = ports
        self.bridge = bridge
        self._address = ipaddress.ip_interface(address) if address else None
        self._target = target
        self._relay_port = relay_port
        self._queue_s = queue_s
        self.features = frozenset({"rate", "loss", "down"} | ({"delay", "jitter"} if target else set()))
        self._table = "hilrig_" + re.sub(r"[^A-Za-z0-9]", "_", bridge)  # nft identifiers: no '-', no '@'
        self._created_bridge = False
        self._added_address = False
        self._enslaved: list[str] = []
        self._relay: Relay | None = None
        self._applied = LinkSettings()

    async def start(self) -> None:
        """Bridge the ports (they must exist); on any failure undo what was done and raise."""
        try:
            for port in self.ports:
                await run_command("ip", "link", "show", "dev", port)  # names the port in the error if missing
            if not await _exists(self.bridge):
                await run_command("ip", "link", "add", self.bridge, "type", "bridge", "stp_state", "0")
                self._created_bridge = True
            for port in self.ports:
                await run_command("ip", "link", "set", "dev", port, "master", self.bridge)
                self._enslaved.append(port)
                await run_command("ip", "link", "set", "dev", port, "up")
            await run_command("ip", "link", "set", "dev", self.bridge, "up")
            # What a killed rig left: its drop table and its tbf qdiscs (deleting a root qdisc that is not
            # there fails; deleting a NIC's default one only resets it), so the link starts unshaped.
            await delete_table(NFT_FAMILY, self._table)
            for port in self.ports:
                with contextlib.suppress(BackendError):
                    await run_command("tc", "qdisc", "del", "dev", port, "root")
            if self._address is not None:
                await run_command("ip", "addr", "replace", str(self._address), "dev", self.bridge)
                self._added_address = True
            if self._target is not None and self._address is not None:
                self._relay = Relay(*self._target, listen_host=str(self._address.ip), listen_port=self._relay_port)
                await self._relay.start()
        except BaseException:
            await self.close()
            raise

    async def _apply(self, old: LinkSettings, new: LinkSettings) -> None:
        if (old.rate_bps, old.burst_bytes) != (new.rate_bps, new.burst_bytes):
            for port in self.ports:
                if old.rate_bps and (not new.rate_bps or new.burst_bytes < old.burst_bytes):
                    await run_command("tc", "qdisc", "del", "dev", port, "root")
                if new.rate_bps:
                    await run_command("tc", "qdisc", "replace", "dev", port, "root", *tbf_arguments(new, self._queue_s))
        if (old.loss_pct, old.up) != (new.loss_pct, new.up):
            rules = drop_rules(self._table, NFT_FAMILY, NFT_HOOKS, self.ports, new)
            await run_command("nft", "-f", "-", stdin=rules.encode())

    def details(self) -> dict[str, str]:
        details = {"bridge": self.bridge, "ports": ",".join(self.ports)}
        if self._address is not None:
            details["address"] = str(self._address)
        if self._relay is not None and self._target is not None and self._address is not None:
            details["relay"] = f"{self._address.ip}:{self._relay.port}"
            details["target"] = f"{self._target[0]}:{self._target[1]}"
        return details

    async def close(self) -> None:
        """Undo start() and apply(); safe to call twice and after a failed start. The ports stay.

        Independent steps run side by side, so SIGTERM ends the rig well within a second even on a busy box."""
        errors: list[str] = []

        async def attempt(step: Coroutine[Any, Any, Any]) -> None:
            try:
                await step
            except BackendError as error:
                errors.append(str(error))

        if self._relay is not None:
            await self._relay.stop()
            self._relay = None
        steps = [attempt(delete_table(NFT_FAMILY, self._table))]
        if self._applied.rate_bps:
            steps += [attempt(run_command("tc", "qdisc", "del", "dev", port, "root")) for port in self.ports]
        self._applied = LinkSettings()
        steps += [attempt(run_command("ip", "link", "set", "dev", port, "nomaster")) for port in self._enslaved]
        self._enslaved.clear()
        await asyncio.gather(*steps)
        if self._created_bridge:
            await attempt(run_command("ip", "link", "del", self.bridge))
            self._created_bridge = self._added_address = False
        if self._added_address and self._address is not None:
            await attempt(run_command("ip", "addr", "del", str(self._address), "dev", self.bridge))
            self._added_address = False
        if errors:
            raise BackendError("; ".join(errors))


async def _exists(interface: str) -> bool:
    try:
        await run_command("ip", "link", "show", "dev", interface)
    except BackendError:
        return False
    return True
