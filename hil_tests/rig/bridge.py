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
* the relay's own TCP connections cross the shaped ports, and they must not see the link worse than the
  gateway would without the relay. Their retransmission timeout is learnt on the fast link (200 ms, the
  kernel's floor for sub-millisecond round trips), so right after a RATE drop it fired on segments that were
  only waiting in tbf's queue: a spurious retransmission, a collapsed window and a doubled timeout stalled
  the relayed link 1-1.5 s. The kernel takes a connection's floor from its route when the connection
  starts (it is folded into the variance then; raising it later changes nothing for open connections, and
  ``TCP_RTO_MIN_US`` may only lower it), so the relay's routes - the bridge's subnet from the start and,
  when the target is elsewhere, a host route to it made before each connection there - carry ``rto_min`` =
  `relay_rto_min`, the longest round trip the shaped link may show at the slowest rate the relay is sized
  for, for as long as the relay runs. The tail loss probe fires
  after two round trips of the fast link whenever two segments are out and re-sends the last one, a
  frame's worth of the slow link wasted each time (a 1.9 s gap measured with the floor alone), and no
  socket option turns it off: ``net.ipv4.tcp_early_retrans`` is 0 while the relay runs (the rig box's or
  rig namespace's setting, restored on close). Loss recovery by duplicate acknowledgements is unchanged.

`close()` undoes exactly what `start()` and `apply()` did (qdiscs, table, ports released from the bridge,
the bridge or the address it created), also after a failed start, and leaves the ports up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import socket
import sys
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
    tbf_limit,
)
from hil_tests.rig.relay import Relay
from hil_tests.rig.shaping import WIRE_HEADER_BYTES, WIRE_PAYLOAD_BYTES, LinkSettings

DEFAULT_BRIDGE = "hilbr0"
# Interface names as the rig accepts them: they go into nft scripts and tc/ip arguments, and the kernel
# itself allows quotes and braces in a name, which would change an nft script's meaning.
INTERFACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,14}")
NFT_FAMILY = "bridge"
NFT_HOOKS = ("forward", "input")
# The slowest rate the relay's retransmission floor is sized for: the HIL scenarios' slow link.
RELAY_SLOWEST_RATE_BPS = 9600
EARLY_RETRANS = "net.ipv4.tcp_early_retrans"  # 0: no tail loss probes (module docstring)


def relay_rto_min(queue_s: float = DEFAULT_QUEUE_SECONDS, slowest_rate_bps: int = RELAY_SLOWEST_RATE_BPS) -> float:
    """Seconds the relay's TCP must wait before it takes a segment for lost: the longest the segment may
    wait in one port's full tbf queue (its limit at the default burst, the segment included) plus one full
    frame ahead of its acknowledgement on the other port, at ``slowest_rate_bps`` (3.6 s at 9.6 kbit/s)."""
    queue_bytes = tbf_limit(LinkSettings(rate_bps=slowest_rate_bps), queue_s)
    return (queue_bytes + WIRE_PAYLOAD_BYTES + WIRE_HEADER_BYTES) * 8 / slowest_rate_bps


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
        relay_slowest_rate_bps: int = RELAY_SLOWEST_RATE_BPS,
    ) -> None:
        """``ports``: two existing interfaces, gateway side first. ``address`` (CIDR) goes on the bridge for
        the relay; ``target`` enables DELAY/JITTER through that relay and needs ``address``;
        ``relay_slowest_rate_bps`` sizes the relay's retransmission floor (`relay_rto_min`)."""
        if len(ports) != 2 or ports[0] == ports[1]:
            raise ValueError(f"the bridge backend needs two different ports, got {','.join(ports)}")
        for name in (*ports, bridge):
            if not INTERFACE_NAME.fullmatch(name):
                raise ValueError(f"not an interface name the rig accepts (letters, digits, _.@-, at most 15): {name!r}")
        if bridge in ports:
            raise ValueError(f"the bridge {bridge!r} cannot also be one of its ports")
        if relay_slowest_rate_bps <= 0:
            raise ValueError(f"the relay's slowest rate must be a positive bit rate, got {relay_slowest_rate_bps}")
        if target is not None and address is None:
            raise ValueError("--target on the bridge backend needs --address: the relay listens on the bridge")
        self.ports = ports
        self.bridge = bridge
        self._address = ipaddress.ip_interface(address) if address else None
        self._target = target
        self._relay_port = relay_port
        self._queue_s = queue_s
        self._relay_floor = ["rto_min", f"{max(1, round(relay_rto_min(queue_s, relay_slowest_rate_bps) * 1000))}ms"]
        self._target_route: list[str] = []  # the host route to the target it added, to delete on close
        self._early_retrans: str | None = None  # net.ipv4.tcp_early_retrans before the relay, to restore
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
                await self._floor_relay_retransmissions(self._address)
                self._relay = Relay(
                    *self._target, listen_host=str(self._address.ip), listen_port=self._relay_port,
                    before_connect=self._floor_way_to_target,
                )
                await self._relay.start()
        except BaseException:
            await self.close()
            raise

    async def _floor_relay_retransmissions(self, address: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> None:
        """Before the relay listens (module docstring): no tail loss probes, and ``rto_min`` on the bridge's
        subnet, the way to the gateway side (and to the target when it is there)."""
        self._early_retrans = (await run_command("sysctl", "-n", EARLY_RETRANS)).strip()
        await run_command("sysctl", "-q", "-w", f"{EARLY_RETRANS}=0")
        await run_command("ip", "route", "replace", str(address.network), "dev", self.bridge, "proto", "kernel",
                          "scope", "link", "src", str(address.ip), *self._relay_floor)  # fmt: skip

    async def _floor_way_to_target(self) -> None:
        """Before each of the relay's connections to the target: a target outside the bridge's subnet gets a
        host route with the floor, along the way the kernel would take now. Now, not at start: that way
        often leads through the address the rig itself puts on the bridge (a default route added after it,
        as on the bench in namespaces). Without any way there, the connection fails as it would anyway."""
        assert self._target is not None and self._address is not None
        target_ip = ipaddress.ip_address(socket.gethostbyname(self._target[0]))
        if target_ip in self._address.network:
            return
        try:
            words = (await run_command("ip", "-o", "route", "get", str(target_ip))).split()
            way = [word for key in ("via", "dev") if key in words for word in (key, words[words.index(key) + 1])]
            route = [f"{target_ip}/{target_ip.max_prefixlen}", *way]
            await run_command("ip", "route", "replace", *route, *self._relay_floor)
        except BackendError as error:
            print(f"rig: no retransmission floor towards the target: {error}", file=sys.stderr, flush=True)
            return
        self._target_route = route

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
        if self._target_route:
            steps.append(attempt(run_command("ip", "route", "del", *self._target_route)))
            self._target_route = []
        if self._early_retrans is not None:
            steps.append(attempt(run_command("sysctl", "-q", "-w", f"{EARLY_RETRANS}={self._early_retrans}")))
            self._early_retrans = None
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
