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
  rig namespace's setting, shared by every rig there: tail_loss_probes.py; the last one out restores
  it). Loss recovery by duplicate acknowledgements is unchanged.
  The rig writes ``/proc/sys/net/ipv4/tcp_early_retrans`` itself, and the unit's
  ``ProtectKernelTunables=yes`` leaves exactly that file writable (``ReadWritePaths=``). Where /proc/sys is
  read-only all the same, the rig still starts: it says once that tail loss probes stay on and why, and
  STATUS shows ``tail_loss_probes=on``.
* The rig's own interfaces say nothing on the link: IPv6 is off on the bridge and its ports (``addrgenmode
  none``, their IPv6 addresses flushed, through netlink with CAP_NET_ADMIN alone), and the bridge does no
  multicast snooping (``mcast_snooping 0``: a snooping bridge joins the all-snoopers groups and reports
  them by IGMP and MLD; a cable floods multicast anyway). Before, the rig's bridge sent router
  solicitations and listener reports onto the shaped link, 13-19 frames in its first 30 s, a second of a
  9.6k link.
* DOWN drops what tbf's queues hold (the qdiscs are re-created after the drop rules are in): when the host
  reads ``OK DOWN``, nothing more crosses, where before up to the burst and 1 s at RATE drained after it.

One rig per port set: `claim.Claim` holds the ports and the bridge from before the first change. Every
change is first written to `journal.Journal` (``--state-dir``), so a rig that was killed is undone by the
next one before it starts, which then says ``restarted=1``. `close()` undoes the same record (qdiscs,
table, routes, sysctls, IPv6 modes, ports released from the bridge, the bridge or the address it created),
also after a failed start, leaves the ports up, and removes the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import socket
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from hil_tests.rig import tail_loss_probes
from hil_tests.rig.claim import Claim
from hil_tests.rig.journal import Changes, Journal, JournalError
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
from hil_tests.rig.tail_loss_probes import EARLY_RETRANS, TailLossProbesOff

DEFAULT_BRIDGE = "hilbr0"
# Interface names as the rig accepts them: they go into nft scripts and tc/ip arguments, and the kernel
# itself allows quotes and braces in a name, which would change an nft script's meaning.
INTERFACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,14}")
NFT_FAMILY = "bridge"
NFT_HOOKS = ("forward", "input")
# The slowest rate the relay's retransmission floor is sized for: the HIL scenarios' slow link.
RELAY_SLOWEST_RATE_BPS = 9600
IPV6_CONF = Path("/proc/sys/net/ipv6/conf")  # absent when the kernel runs without IPv6


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
        state_dir: Path | None = None,
    ) -> None:
        """``ports``: two existing interfaces, gateway side first. ``address`` (CIDR) goes on the bridge for
        the relay; ``target`` enables DELAY/JITTER through that relay and needs ``address``;
        ``relay_slowest_rate_bps`` sizes the relay's retransmission floor (`relay_rto_min`); ``state_dir``
        keeps the record of the changes (`journal`), without which a crash cannot be undone."""
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
        self.features = frozenset({"rate", "loss", "down"} | ({"delay", "jitter"} if target else set()))
        self._table = "hilrig_" + re.sub(r"[^A-Za-z0-9]", "_", bridge)  # nft identifiers: no '-', no '@'
        self._state_dir = state_dir
        self._journal: Journal | None = None
        self._claim = Claim((*ports, bridge))
        self._changes = Changes(list(ports), bridge, self._table)
        self._relay: Relay | None = None
        self._applied = LinkSettings()
        self._tail_loss_probes: TailLossProbesOff | None = None  # held while the relay runs
        self.restarted = False

    async def start(self) -> None:
        """Claim the ports, undo what a killed rig left, bridge the ports (they must exist); on any failure
        undo what was done and raise the first failure (a failed clean-up is added to it as a note)."""
        self._claim.take()
        try:
            await self._start()
        except BaseException as error:
            try:
                await self.close()
            except (BackendError, OSError) as cleanup:
                error.add_note(f"cleaning up after it: {' '.join(str(cleanup).split())}")
            raise

    async def _start(self) -> None:
        for port in self.ports:
            if not await _exists(port):
                raise BackendError(f"port {port} does not exist (--ports {','.join(self.ports)}; on a rig box "
                                   f"RIG_PORTS in /etc/hil-rig/rig.env, `ip -br link` lists the names)")
        if self._state_dir is not None:
            await self._recover(Journal(self._state_dir, "bridge-" + "-".join(self.ports)))
        if not await _exists(self.bridge):
            self._record(created_bridge=True)
            await run_command("ip", "link", "add", self.bridge, "type", "bridge", "stp_state", "0", "mcast_snooping", "0")
        else:
            snooping = await _mcast_snooping(self.bridge)
            if snooping != "0":
                self._record(mcast_snooping=snooping)
                await run_command("ip", "link", "set", "dev", self.bridge, "type", "bridge", "mcast_snooping", "0")
        await self._ipv6_off(self.bridge)
        for port in self.ports:
            await self._ipv6_off(port)
            self._record(enslaved=[*self._changes.enslaved, port])
            await run_command("ip", "link", "set", "dev", port, "master", self.bridge)
            await run_command("ip", "link", "set", "dev", port, "up")
        await run_command("ip", "link", "set", "dev", self.bridge, "up")
        # What a killed rig of an older version (without a record) left: its drop table and its tbf qdiscs
        # (deleting a root qdisc that is not there fails; deleting a NIC's default one only resets it).
        await delete_table(NFT_FAMILY, self._table)
        for port in self.ports:
            with contextlib.suppress(BackendError):
                await run_command("tc", "qdisc", "del", "dev", port, "root")
        if self._address is not None:
            self._record(address=str(self._address))
            await run_command("ip", "addr", "replace", str(self._address), "dev", self.bridge)
        if self._target is not None and self._address is not None:
            await self._floor_relay_retransmissions(self._address)
            self._relay = Relay(
                *self._target, listen_host=str(self._address.ip), listen_port=self._relay_port,
                before_connect=self._floor_way_to_target,
            )
            await self._relay.start()

    async def _recover(self, journal: Journal) -> None:
        """Undo what a rig on these ports that did not stop left (its record), then start a record of our own."""
        try:
            left = journal.load()
        except ValueError as error:
            _log(f"the state file {journal.path} is not one a rig wrote ({error}); undoing what a rig on these "
                 f"ports may have left")
            left = Changes(list(self.ports), self.bridge, self._table, enslaved=list(self.ports), shaped=True)
        if left is not None:
            problems = await _undo(left, strict=False)
            self.restarted = True
            _log(f"a rig on {','.join(self.ports)} did not stop cleanly; undid what it left, the link is unshaped and "
                 f"up (STATUS says restarted=1)" + "".join(f"; {problem}" for problem in problems))
        try:
            journal.save(self._changes)
        except JournalError as error:
            _log(f"{error}; running without it: if this rig is killed, what it changed stays until a rig with a "
                 f"record undoes it or the box reboots")
            return
        self._journal = journal

    def _record(self, **changes: Any) -> None:
        """Write down a change before making it (journal module docstring)."""
        for name, value in changes.items():
            setattr(self._changes, name, value)
        if self._journal is not None:
            self._journal.save(self._changes)

    async def _ipv6_off(self, interface: str) -> None:
        """No IPv6 address on ``interface``, now or later: nothing of the rig's own talks on the link. A kernel
        without IPv6 (``ipv6.disable=1``) has nothing to switch off."""
        if not IPV6_CONF.exists():
            return
        mode = await _addrgenmode(interface)
        if mode != "none":
            self._record(addrgenmodes={**self._changes.addrgenmodes, interface: mode})
            await run_command("ip", "link", "set", "dev", interface, "addrgenmode", "none")
        await run_command("ip", "-6", "addr", "flush", "dev", interface)

    async def _floor_relay_retransmissions(self, address: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> None:
        """Before the relay listens (module docstring): no tail loss probes, and ``rto_min`` on the bridge's
        subnet, the way to the gateway side (and to the target when it is there)."""
        probes = TailLossProbesOff(self.bridge)
        try:
            original = probes.take()
        except OSError as error:
            _log(f"tail loss probes stay on: cannot write {EARLY_RETRANS} ({error.strerror}; the unit grants it "
                 f"with ReadWritePaths=); after a RATE drop the relay's TCP may resend a queued segment")
        else:
            self._record(sysctls={**self._changes.sysctls, str(EARLY_RETRANS): original})
            self._tail_loss_probes = probes
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
            if route not in self._changes.routes:
                self._record(routes=[*self._changes.routes, route])
            await run_command("ip", "route", "replace", *route, *self._relay_floor)
        except BackendError as error:
            print(f"rig: no retransmission floor towards the target: {error}", file=sys.stderr, flush=True)

    async def _apply(self, old: LinkSettings, new: LinkSettings) -> None:
        if new.rate_bps and not self._changes.shaped:
            self._record(shaped=True)
        if (old.rate_bps, old.burst_bytes) != (new.rate_bps, new.burst_bytes):
            for port in self.ports:
                if old.rate_bps and (not new.rate_bps or new.burst_bytes < old.burst_bytes):
                    await run_command("tc", "qdisc", "del", "dev", port, "root")
                if new.rate_bps:
                    await run_command("tc", "qdisc", "replace", "dev", port, "root", *tbf_arguments(new, self._queue_s))
        if (old.loss_pct, old.up) != (new.loss_pct, new.up):
            rules = drop_rules(self._table, NFT_FAMILY, NFT_HOOKS, self.ports, new)
            await run_command("nft", "-f", "-", stdin=rules.encode())
        if old.up and not new.up and new.rate_bps:
            # What tbf holds would drain for up to burst + queue at RATE after OK DOWN: a new qdisc drops it.
            for port in self.ports:
                await run_command("tc", "qdisc", "del", "dev", port, "root")
                await run_command("tc", "qdisc", "replace", "dev", port, "root", *tbf_arguments(new, self._queue_s))
        if not new.rate_bps and self._changes.shaped:
            self._record(shaped=False)

    def details(self) -> dict[str, str]:
        details = {"bridge": self.bridge, "ports": ",".join(self.ports)}
        if self._address is not None:
            details["address"] = str(self._address)
        if self._relay is not None and self._target is not None and self._address is not None:
            details["relay"] = f"{self._address.ip}:{self._relay.port}"
            details["target"] = f"{self._target[0]}:{self._target[1]}"
        if self._relay is not None:
            details["tail_loss_probes"] = tail_loss_probes.state()  # the kernel's, whoever set it
        return details

    async def close(self) -> None:
        """Undo start() and apply(); safe to call twice and after a failed start. The ports stay.

        Independent steps run side by side, so SIGTERM ends the rig well within a second even on a busy box.
        The record goes only when everything was undone: what failed is undone again by the next rig."""
        if self._relay is not None:
            await self._relay.stop()
            self._relay = None
        errors = await _undo(self._changes, strict=True)
        self._changes = Changes(list(self.ports), self.bridge, self._table)
        self._applied = LinkSettings()
        if self._tail_loss_probes is not None:
            self._tail_loss_probes.release()
            self._tail_loss_probes = None
        if self._journal is not None and not errors:
            try:
                self._journal.remove()
            except OSError as error:
                errors.append(f"cannot remove the state file: {error}")
            self._journal = None
        self._claim.release()
        if errors:
            raise BackendError("; ".join(errors))


async def _undo(changes: Changes, *, strict: bool) -> list[str]:
    """Undo ``changes`` as far as the kernel lets; the failures, as messages. ``strict=False`` (a dead rig's
    record, written before each change) skips what the dead rig had not got round to doing."""
    errors: list[str] = []

    async def attempt(step: Coroutine[Any, Any, Any]) -> None:
        try:
            await step
        except (BackendError, OSError) as error:
            errors.append(str(error))

    async def restore_sysctl(path: str, value: str) -> None:
        if path == str(EARLY_RETRANS):
            tail_loss_probes.restore(value, changes.bridge)  # not under another rig's relay
        elif Path(path).read_text().strip() != value:
            Path(path).write_text(value)

    steps = [attempt(delete_table(NFT_FAMILY, changes.table))]
    steps += [attempt(run_command("ip", "route", "del", *route)) for route in changes.routes if strict or await _has_route(route)]
    steps += [attempt(restore_sysctl(path, value)) for path, value in changes.sysctls.items()]
    if changes.shaped:
        steps += [attempt(_delete_tbf(port)) for port in changes.ports]
    steps += [attempt(run_command("ip", "link", "set", "dev", port, "nomaster")) for port in changes.enslaved
              if strict or await _exists(port)]  # fmt: skip
    await asyncio.gather(*steps)
    for interface, mode in changes.addrgenmodes.items():
        if (interface != changes.bridge or not changes.created_bridge) and (strict or await _exists(interface)):
            await attempt(_restore_ipv6(interface, mode, bounce=interface != changes.bridge))
    if changes.created_bridge:
        if strict or await _exists(changes.bridge):
            await attempt(run_command("ip", "link", "del", changes.bridge))
        return errors
    if changes.mcast_snooping is not None and (strict or await _exists(changes.bridge)):
        await attempt(run_command("ip", "link", "set", "dev", changes.bridge, "type", "bridge",
                                  "mcast_snooping", changes.mcast_snooping))
    if changes.address is not None and (strict or await _exists(changes.bridge)):
        with contextlib.suppress(BackendError):  # a dead rig may have died before adding it
            await run_command("ip", "addr", "del", changes.address, "dev", changes.bridge)
    return errors


async def _delete_tbf(port: str) -> None:
    """Delete the port's tbf; a port without one (a failed RATE, a dead rig's last step) keeps its qdisc."""
    if "tbf" in await run_command("tc", "qdisc", "show", "dev", port, "root"):
        await run_command("tc", "qdisc", "del", "dev", port, "root")


async def _restore_ipv6(interface: str, mode: str, *, bounce: bool) -> None:
    """Give ``interface`` its IPv6 address mode back; a port is set down and up, which makes the kernel
    give it its link-local address again (it was up before the rig and stays up after it)."""
    await run_command("ip", "link", "set", "dev", interface, "addrgenmode", mode)
    if bounce:
        await run_command("ip", "link", "set", "dev", interface, "down")
        await run_command("ip", "link", "set", "dev", interface, "up")


async def _addrgenmode(interface: str) -> str:
    """The kernel's IPv6 address generation mode of ``interface`` (``eui64``, ``none``, ...)."""
    links = json.loads(await run_command("ip", "-d", "-j", "link", "show", "dev", interface))
    return str(links[0].get("inet6_addr_gen_mode", "none"))


async def _mcast_snooping(bridge: str) -> str:
    links = json.loads(await run_command("ip", "-d", "-j", "link", "show", "dev", bridge))
    return str(links[0].get("linkinfo", {}).get("info_data", {}).get("mcast_snooping", "0"))


async def _has_route(route: list[str]) -> bool:
    try:
        return bool((await run_command("ip", "route", "show", route[0])).strip())
    except BackendError:
        return False


def _log(message: str) -> None:
    print(f"rig: {message}", file=sys.stderr, flush=True)


async def _exists(interface: str) -> bool:
    try:
        await run_command("ip", "link", "show", "dev", interface)
    except BackendError:
        return False
    return True
