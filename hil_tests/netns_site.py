"""The site around a netns rig: the cloud broker and the gateway inside the rig's namespaces, and the host's way in.

The netns rig (`hil_tests/rig/netns.py`) joins a gateway and a cloud namespace with a shaped veth pair. A
scenario's gateway must run *in* the gateway namespace, so that its own TCP stack sends the uplink over that
veth, and the cloud broker in the cloud namespace. Everything else of a scenario (thermostats, the tap,
state store clients, controllers, the cloud collector) stays on the host: each namespace gets a second,
unshaped veth pair to the host, its *host link*. The gateway listens on its host link address, as a real
gateway listens on the site LAN; the collector reaches the cloud broker over the cloud's host link. Only the
rig's veth is shaped, and the rig's drop rules match only that veth, so the shaping stays on the
gateway -> cloud path. Neither namespace forwards, so the uplink cannot leak through the host.

The host links live as long as their namespaces (deleting a namespace deletes its veth ends and so their
host peers); `HostLinks.close` removes them early anyway, so a run leaves no interface behind.
"""

from __future__ import annotations

import ipaddress
import random
import secrets
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testing.processes import GatewayProcess, stop_child, wait_for_port
from testing.waiting import WaitTimeout, wait_until

# Inside the cloud namespace every port is free, so the broker takes the well-known one: the rig's delay
# relay is told where the cloud is (``--target``) before the broker exists.
CLOUD_BROKER_PORT = 1883
HOST_LINK_POOL = ipaddress.ip_network("10.202.0.0/16")
LINK_PREFIX = 30


class SiteError(RuntimeError):
    """A command that wires the site failed; the message names it and carries its stderr."""


def _run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SiteError(f"{' '.join(argv)}: {result.stderr.strip() or f'exit {result.returncode}'}")
    return result.stdout


def netns_refusal() -> str | None:
    """Why this machine cannot run a netns bench (``ip netns add`` refused), or None when it can."""
    probe = f"hilsite-probe-{secrets.token_hex(3)}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return f"the netns bench needs 'ip netns add' (root): {result.stderr.strip()}"
    _run("ip", "netns", "del", probe)
    return None


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address or a route in, so a host link never shadows one."""
    networks = []
    for line in _run("ip", "-4", "-o", "addr", "show").splitlines():
        networks.append(ipaddress.ip_interface(line.split()[3]).network)
    for line in _run("ip", "-4", "route", "show", "table", "all").splitlines():
        destination = line.split()[0]
        if destination[0].isdigit():
            networks.append(ipaddress.ip_network(destination, strict=False))
    return networks


def _free_link_networks(count: int) -> list[ipaddress.IPv4Network]:
    """``count`` random /30s of the pool that overlap nothing on the host (parallel runs pick apart)."""
    used = _networks_in_use()
    candidates = list(HOST_LINK_POOL.subnets(new_prefix=LINK_PREFIX))
    random.shuffle(candidates)
    free = [n for n in candidates if not any(n.overlaps(u) for u in used)][:count]
    if len(free) < count:
        raise SiteError(f"no free /{LINK_PREFIX} left in {HOST_LINK_POOL} for the host links")
    return free


@dataclass(frozen=True)
class HostLink:
    """An unshaped veth pair between the host and ``namespace``; ``address`` is the namespace's end."""

    namespace: str
    host_device: str
    address: str


class HostLinks:
    """The host's links into the rig's gateway and cloud namespaces (see the module docstring)."""

    def __init__(self, gateway_ns: str, cloud_ns: str) -> None:
        run_id = gateway_ns.split("-")[1]  # the rig names them hilrig-<run>-gw / hilrig-<run>-cloud
        self._plan = ((gateway_ns, f"hl{run_id}g"), (cloud_ns, f"hl{run_id}c"))
        self._created: list[str] = []
        self.gateway: HostLink
        self.cloud: HostLink

    def open(self) -> HostLinks:
        """Create both links; on any failure remove what was created and raise."""
        try:
            links = []
            for (namespace, device), network in zip(self._plan, _free_link_networks(len(self._plan)), strict=True):
                host_ip, namespace_ip = list(network.hosts())
                _run("ip", "link", "add", device, "type", "veth", "peer", "name", "lan0", "netns", namespace)
                self._created.append(device)
                _run("ip", "addr", "add", f"{host_ip}/{LINK_PREFIX}", "dev", device)
                _run("ip", "link", "set", device, "up")
                _run("ip", "-n", namespace, "addr", "add", f"{namespace_ip}/{LINK_PREFIX}", "dev", "lan0")
                _run("ip", "-n", namespace, "link", "set", "lan0", "up")
                links.append(HostLink(namespace, device, str(namespace_ip)))
            self.gateway, self.cloud = links
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Delete the host ends (which deletes their peers); one already gone with its namespace is fine."""
        while self._created:
            device = self._created.pop()
            if subprocess.run(["ip", "link", "show", device], capture_output=True, check=False).returncode == 0:
                _run("ip", "link", "del", device)

    def __enter__(self) -> HostLinks:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class PrefixedGateway(GatewayProcess):
    """Our gateway run behind a command prefix (``ip netns exec <ns>``, a bench file's ``gateway.run_in``),
    listening on ``listen_host``: where its uplink goes through the rig and the bench's clients reach it.

    The prefix must exec the command (``ip netns exec`` does), so the process (and what ``kill9`` kills) is
    the gateway itself.
    """

    def __init__(self, prefix: Sequence[str], listen_host: str, data_dir: Path, config: Path, port: int = 0) -> None:
        super().__init__(data_dir, config=config, port=port)
        self.prefix = list(prefix)
        self.listen_host = listen_host

    @property
    def host(self) -> str:
        return self.listen_host

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--listen") + 1] = f"{self.listen_host}:{self.port}"
        return [*self.prefix, *command]


class NamespacedGateway(PrefixedGateway):
    """Our gateway run with ``ip netns exec`` in the gateway namespace, listening on its host link address."""

    def __init__(self, namespace: str, listen_host: str, data_dir: Path, config: Path) -> None:
        super().__init__(["ip", "netns", "exec", namespace], listen_host, data_dir, config)


class NamespacedMosquitto:
    """The cloud broker: mosquitto in the cloud namespace, on loopback (the rig's relay) and the host link.

    Ready means mosquitto logged both listen sockets and the host can connect, never a fixed sleep.
    """

    def __init__(self, work_dir: Path, link: HostLink, port: int = CLOUD_BROKER_PORT) -> None:
        self.work_dir = work_dir
        self.namespace = link.namespace
        self.host = link.address
        self.port = port
        self.log_path = work_dir / f"mosquitto-{port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> NamespacedMosquitto:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        conf = self.work_dir / f"mosquitto-{self.port}.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\nlistener {self.port} {self.host}\nallow_anonymous true\n"
            "persistence false\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n"
            "log_type information\n"
        )
        with open(self.log_path, "wb") as log:
            command = ["ip", "netns", "exec", self.namespace, "mosquitto", "-c", str(conf)]
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        process = self.process

        def listening() -> bool:  # mosquitto's log is its only readiness signal
            return (process.poll() is not None
                    or self.log_path.read_text(errors="replace").count(f"listen socket on port {self.port}") >= 2)

        try:
            wait_until(listening, timeout)
            if process.poll() is not None:
                raise WaitTimeout("mosquitto exited")
        except WaitTimeout:
            self.stop()
            raise SiteError(f"mosquitto in {self.namespace} did not listen:\n{self.log_path.read_text()}") from None
        wait_for_port(self.host, self.port, max(0.1, deadline - time.monotonic()))
        return self

    def stop(self) -> None:
        stop_child(self.process)

    def __enter__(self) -> NamespacedMosquitto:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
