"""A bench in three network namespaces, wired the way a rig box is cabled between a gateway and its uplink.

The bridge backend (`hil_tests/rig/bridge.py`) shapes two interfaces it is *given*; on a bench they are the
rig box's two Ethernet ports. Here each port is the rig's end of a veth pair, moved into the ``rig``
namespace and renamed like a NIC (``eth1`` towards the gateway, ``eth2`` towards the uplink), so the rig
runs the very code path it runs on hardware and never learns that the cable is virtual:

```
 gateway namespace            rig namespace                     uplink namespace
 uplink0 10.203.0.1/24 ─veth─ eth1 ┐                   ┌ eth2 ─veth─ wan0 10.203.0.2/24
 default via 10.203.0.2            └─ bridge hilbr0 ───┘            (the modem / the lab router)
                                      10.203.0.3/24 (the rig's delay relay)
```

The gateway namespace's network stack is set as the gateway image sets the box's (its ``sysctl.d``: the
uplink's retransmission floor). The gateway namespace's default route points at the uplink namespace, as a
gateway's points at its modem, so the gateway reaches the cloud broker's address through the rig whatever
that address is. The host reaches the gateway and the cloud broker over unshaped host links
(`netns_site.HostLinks`), as a bench PC sits on the site LAN and reaches the cloud over the lab network. The
rig namespace has a default route too, so its relay reaches the same cloud address. `close()` deletes the
three namespaces, and with them every veth, bridge, qdisc and nftables table, whatever state a failed test
left them in.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from hil_tests.netns_site import HostLinks, NamespacedMosquitto, SiteError
from hil_tests.rig.launcher import REPO_ROOT, local_rig

GATEWAY_PORT_NAME = "eth1"
UPLINK_PORT_NAME = "eth2"
GATEWAY_ADDRESS = "10.203.0.1"
UPLINK_ADDRESS = "10.203.0.2"
RIG_ADDRESS = "10.203.0.3"
PREFIX_LENGTH = 24
CLOUD_PORT = 1883  # both fresh namespaces: the well-known ports are free
GATEWAY_PORT = 1883
IMAGE_SYSCTL_DIR = REPO_ROOT / "images" / "gateway" / "rootfs" / "etc" / "sysctl.d"


def _run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SiteError(f"{' '.join(argv)}: {result.stderr.strip() or f'exit {result.returncode}'}")
    return result.stdout


class BridgeSite:
    """Namespaces ``gateway``, ``rig`` and ``uplink`` (unique per run) cabled through the rig's two ports."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id or secrets.token_hex(4)
        # HIL_NETNS_PREFIX: benches that share a machine tell their namespaces apart at a glance.
        prefix = os.environ.get("HIL_NETNS_PREFIX", "hilbr")
        self.gateway_ns = f"{prefix}-{self.run_id}-gw"
        self.rig_ns = f"{prefix}-{self.run_id}-rig"
        self.uplink_ns = f"{prefix}-{self.run_id}-up"
        self.ports = (GATEWAY_PORT_NAME, UPLINK_PORT_NAME)
        self.rig_address = f"{RIG_ADDRESS}/{PREFIX_LENGTH}"
        self._created: list[str] = []
        self._links: HostLinks | None = None
        self.host_links: HostLinks

    @property
    def namespaces(self) -> tuple[str, str, str]:
        return self.gateway_ns, self.rig_ns, self.uplink_ns

    def exec_in(self, namespace: str) -> list[str]:
        """The command prefix that runs a program in ``namespace``."""
        return ["ip", "netns", "exec", namespace]

    def open(self) -> BridgeSite:
        """Create namespaces, cables and addresses; on any failure delete what was created and raise."""
        try:
            for namespace in self.namespaces:
                _run("ip", "netns", "add", namespace)
                self._created.append(namespace)
                _run("ip", "-n", namespace, "link", "set", "lo", "up")
            apply_image_sysctls(self.gateway_ns)
            self._cable(self.gateway_ns, "uplink0", GATEWAY_PORT_NAME, "a")
            self._cable(self.uplink_ns, "wan0", UPLINK_PORT_NAME, "b")
            for namespace, device, address in (
                (self.gateway_ns, "uplink0", GATEWAY_ADDRESS), (self.uplink_ns, "wan0", UPLINK_ADDRESS)
            ):
                # A wire carries frames, not the 64 KB GSO packets a veth passes on whole: cap them at a frame.
                _run("ip", "-n", namespace, "link", "set", device, "gso_max_size", "1500")
                _run("ip", "-n", namespace, "addr", "add", f"{address}/{PREFIX_LENGTH}", "dev", device)
                _run("ip", "-n", namespace, "link", "set", device, "up")
            self._links = HostLinks(self.gateway_ns, self.uplink_ns).open()
            self.host_links = self._links
            # After the host links: a default route is added only once its gateway is on a connected net.
            _run("ip", "-n", self.gateway_ns, "route", "add", "default", "via", UPLINK_ADDRESS)
        except BaseException:
            self.close()
            raise
        return self

    def _cable(self, namespace: str, device: str, port: str, tag: str) -> None:
        """A veth pair: ``device`` in ``namespace``, its peer in the rig namespace renamed to ``port``."""
        peer = f"hb{self.run_id}{tag}"
        _run("ip", "link", "add", f"{peer}x", "netns", namespace, "type", "veth", "peer", "name", peer, "netns", self.rig_ns)
        _run("ip", "-n", namespace, "link", "set", f"{peer}x", "name", device)
        _run("ip", "-n", self.rig_ns, "link", "set", peer, "name", port)

    def rig_routes(self) -> None:
        """The rig box's default route (for its relay), once the rig has put its address on the bridge."""
        _run("ip", "-n", self.rig_ns, "route", "replace", "default", "via", UPLINK_ADDRESS)

    def close(self) -> None:
        if self._links is not None:
            self._links.close()
            self._links = None
        while self._created:
            namespace = self._created.pop()
            if namespace in list_namespaces():
                _run("ip", "netns", "del", namespace)

    def __enter__(self) -> BridgeSite:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def image_sysctls() -> list[tuple[str, str]]:
    """The ``key = value`` settings the gateway image puts in ``/etc/sysctl.d`` (its uplink's retransmission
    floor, appliance/tcp_floor.py), in file order."""
    settings = []
    for path in sorted(IMAGE_SYSCTL_DIR.glob("*.conf")):
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith(("#", ";")):
                key, _, value = line.partition("=")
                settings.append((key.strip(), value.strip()))
    return settings


def apply_image_sysctls(namespace: str) -> None:
    """Configure ``namespace``'s network stack as the gateway image configures the gateway's box."""
    for key, value in image_sysctls():
        _run("ip", "netns", "exec", namespace, "sysctl", "-q", "-w", f"{key}={value}")


def list_namespaces() -> set[str]:
    out = _run("ip", "netns", "list")
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def leftovers(namespaces: Sequence[str]) -> set[str]:
    """Which of ``namespaces`` still exist (a test's cleanup check)."""
    return set(namespaces) & list_namespaces()


@contextlib.contextmanager
def bridge_bench(folder: Path, artifacts: Path, relay: bool = True) -> Iterator[tuple[Path, BridgeSite]]:
    """A whole bench in namespaces, and the bench file that describes it: ``folder/bench.toml`` (and the site).

    The rig runs in the rig namespace (``--backend bridge --ports eth1,eth2``; with ``relay`` also
    ``--address``/``--target`` for DELAY/JITTER) on a pty whose device goes into the file as a rig box's
    serial device would; mosquitto runs in the uplink namespace (``cloud.start = false``); the file says
    how to run the gateway in the gateway namespace (``gateway.run_in``). Everything goes on exit.
    """
    site = BridgeSite()
    with contextlib.ExitStack() as stack:
        stack.enter_context(site)
        links = site.host_links
        stack.enter_context(NamespacedMosquitto(folder / "cloud", links.cloud, CLOUD_PORT))
        rig_args = ["--backend", "bridge", "--ports", ",".join(site.ports)]
        if relay:
            rig_args += ["--address", site.rig_address, "--target", f"{links.cloud.address}:{CLOUD_PORT}"]
        ready = stack.enter_context(local_rig(rig_args, folder / "rig.log", prefix=site.exec_in(site.rig_ns)))
        if relay:
            site.rig_routes()
        config = folder / "bench.toml"
        config.write_text(
            f"""# A bridge rig box between a gateway and its uplink, in network namespaces (hil_tests/bridge_site.py).
[rig]
serial = "{ready['serial']}"
backend = "bridge"
baud = 115200

[gateway]
start = true
host = "{links.gateway.address}"
port = {GATEWAY_PORT}
run_in = {json.dumps(site.exec_in(site.gateway_ns))}
upstream_formats = ["message"]

[cloud]
start = false
host = "{links.cloud.address}"
port = {CLOUD_PORT}

[devices]
count = 20
id_prefix = "thermostat-"
start = true
micropython = "{REPO_ROOT / '.venv/bin/micropython'}"
firmware = "{REPO_ROOT / 'device_firmware/main.py'}"

[artifacts]
dir = "{artifacts}"
"""
        )
        yield config, site


def main() -> None:
    """``python -m hil_tests.bridge_site FOLDER [--plain]``: bring the bench up, print its bench file's
    path, and take it down on Ctrl-C or SIGTERM; meanwhile ``pytest hil_tests/scenarios --bench`` it."""
    folder = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path("build/bridge-bench").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    stop = signal.SIGTERM
    signal.signal(stop, signal.default_int_handler)  # SIGTERM ends the bench as Ctrl-C does: cleanly
    with bridge_bench(folder, folder / "artifacts", relay="--plain" not in sys.argv) as (config, _):
        print(f"bench up: pytest hil_tests/scenarios --bench {config}   (Ctrl-C takes it down)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
