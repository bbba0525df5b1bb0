"""The kernel backend: a veth pair between a gateway and a cloud network namespace, shaped by tc and nftables.

This is how a Linux rig box shapes a real link, so the gateway's own TCP stack (retransmissions, window,
keep-alive) meets the bad link instead of a relay that hides it. The bench creates both namespaces with
names unique per run, so parallel runs and leftovers of a crashed run never collide, and removes them in
`close()` (deleting a namespace deletes its veth end, qdiscs and nftables tables with it).

* rate: ``tc tbf`` on the egress of both veth ends. A tbf qdisc can stall for good when its burst is lowered
  while GSO super-packets larger than the new burst are queued, so both ends get ``gso_max_size 1500`` and
  `LinkSettings` keeps the burst at 1600 bytes or more.
* loss and DOWN: an nftables table in each namespace drops packets arriving on the veth (``numgen random``
  for LOSS, everything for DOWN). Real packets are lost, so TCP really retransmits; DOWN stalls open
  connections and new connections hang in SYN retransmission until UP or their own timeout.
* delay and jitter need netem, which this kernel lacks. Given a target (the cloud endpoint inside the cloud
  namespace), the backend runs the userspace relay *inside the cloud namespace* for them: the gateway
  connects across the shaped veth to ``cloud_ip:relay port``, the relay delays and forwards. Without a
  target the backend does not claim delay and jitter, so ``STATUS`` leaves them out and a non-zero
  ``DELAY`` is answered ``ERR``.
"""

from __future__ import annotations

import secrets

from hil_tests.rig.kernel import (
    DEFAULT_QUEUE_SECONDS,
    BackendError,
    KernelShaping,
    drop_rules,
    run_command,
    tbf_arguments,
)
from hil_tests.rig.namespace_sockets import NamespaceSockets
from hil_tests.rig.relay import Relay
from hil_tests.rig.shaping import LinkSettings

GATEWAY_ADDRESS = "10.201.0.1"
CLOUD_ADDRESS = "10.201.0.2"
PREFIX_LENGTH = 30
NFT_TABLE = "hilrig"


class NetnsBackend(KernelShaping):
    """Owns the namespace pair of one run; `apply` makes the kernel match a `LinkSettings`."""

    name = "netns"
    restarted = False  # its namespaces are new on every start; the launcher deletes a killed rig's

    def __init__(self, run_id: str | None = None, target: tuple[str, int] | None = None, relay_port: int = 0,
                 queue_s: float = DEFAULT_QUEUE_SECONDS) -> None:
        """``target``: the cloud endpoint as seen from inside the cloud namespace; enables delay and jitter.
        ``queue_s``: how long tbf's queue is at the current rate."""
        self._queue_s = queue_s
        run_id = run_id or secrets.token_hex(4)
        self.features = frozenset({"rate", "loss", "down"} | ({"delay", "jitter"} if target else set()))
        self._target = target
        self._relay_port = relay_port
        self._cloud_sockets: NamespaceSockets | None = None
        self._relay: Relay | None = None
        self.gateway_ns = f"hilrig-{run_id}-gw"
        self.cloud_ns = f"hilrig-{run_id}-cloud"
        self._veth = {self.gateway_ns: f"hr{run_id}g", self.cloud_ns: f"hr{run_id}c"}
        self._created: list[str] = []
        self._applied = LinkSettings()

    async def start(self) -> None:
        """Create namespaces, veth pair and addresses; on any failure remove what was created and raise."""
        try:
            for namespace in (self.gateway_ns, self.cloud_ns):
                await run_command("ip", "netns", "add", namespace)
                self._created.append(namespace)
            gw_veth, cloud_veth = self._veth[self.gateway_ns], self._veth[self.cloud_ns]
            await run_command(
                "ip", "link", "add", gw_veth, "netns", self.gateway_ns,
                "type", "veth", "peer", "name", cloud_veth, "netns", self.cloud_ns,
            )  # fmt: skip
            for namespace, address in ((self.gateway_ns, GATEWAY_ADDRESS), (self.cloud_ns, CLOUD_ADDRESS)):
                veth = self._veth[namespace]
                await run_command("ip", "-n", namespace, "link", "set", veth, "gso_max_size", "1500")
                await run_command("ip", "-n", namespace, "addr", "add", f"{address}/{PREFIX_LENGTH}", "dev", veth)
                await run_command("ip", "-n", namespace, "link", "set", veth, "up")
                await run_command("ip", "-n", namespace, "link", "set", "lo", "up")
            if self._target is not None:
                self._cloud_sockets = NamespaceSockets(self.cloud_ns)
                self._relay = Relay(
                    *self._target,
                    listen_host=CLOUD_ADDRESS,
                    listen_port=self._relay_port,
                    socket_factory=self._cloud_sockets.socket,
                )
                await self._relay.start()
        except BaseException:
            await self.close()
            raise

    async def _apply(self, old: LinkSettings, new: LinkSettings) -> None:
        for namespace, veth in self._veth.items():
            if (old.rate_bps, old.burst_bytes) != (new.rate_bps, new.burst_bytes):
                if new.rate_bps:
                    await run_command(
                        "tc", "-n", namespace, "qdisc", "replace", "dev", veth, "root", *tbf_arguments(new, self._queue_s)
                    )  # fmt: skip
                elif old.rate_bps:
                    await run_command("tc", "-n", namespace, "qdisc", "del", "dev", veth, "root")
            if (old.loss_pct, old.up) != (new.loss_pct, new.up):
                rules = drop_rules(NFT_TABLE, "inet", ("input",), (veth,), new).encode()
                await run_command("ip", "netns", "exec", namespace, "nft", "-f", "-", stdin=rules)

    def details(self) -> dict[str, str]:
        details = {
            "gateway_ns": self.gateway_ns,
            "cloud_ns": self.cloud_ns,
            "gateway_ip": GATEWAY_ADDRESS,
            "cloud_ip": CLOUD_ADDRESS,
        }
        if self._relay is not None and self._target is not None:
            details["relay"] = f"{CLOUD_ADDRESS}:{self._relay.port}"
            details["target"] = f"{self._target[0]}:{self._target[1]}"
        return details

    async def close(self) -> None:
        """Delete the namespaces this run created; safe to call twice and after a failed start."""
        if self._relay is not None:
            await self._relay.stop()
            self._relay = None
        if self._cloud_sockets is not None:
            self._cloud_sockets.close()
            self._cloud_sockets = None
        while self._created:
            namespace = self._created.pop()
            try:
                await run_command("ip", "netns", "del", namespace)
            except BackendError:
                if namespace in await list_namespaces():
                    raise


async def list_namespaces() -> set[str]:
    out = await run_command("ip", "netns", "list")
    return {line.split()[0] for line in out.splitlines() if line.strip()}
