"""Tail loss probes off while any rig's relay runs: ``net.ipv4.tcp_early_retrans``, shared by the rigs of a box.

The setting is one per network namespace, and a box may run one rig per port set. Each rig used to save the
value it found and restore it on stop, so the second rig found 0 (the first one's), and when the first one
stopped it gave the box its value back under the second, whose STATUS still said ``tail_loss_probes=off``.

Rules:

* A rig that turns the probes off holds a listening socket in the abstract unix namespace,
  ``hil-rig/tail-loss-probes-off/<bridge>/<value the box had>``. Like the port claims (claim.py) it belongs
  to the network namespace and dies with its process however it ends, so the set of holders is exactly the
  set of live rigs that need the probes off; /proc/net/unix lists them.
* The value the box had is the first holder's: a rig that finds 0 while others hold it takes their value,
  so whichever rig stops last gives the box the value it had before any rig.
* A rig (or the recovery of a dead rig's record) restores the value only when no other live rig holds it.
* STATUS reads the setting itself, never a flag set at start.
"""

from __future__ import annotations

import socket
from pathlib import Path

EARLY_RETRANS = Path("/proc/sys/net/ipv4/tcp_early_retrans")  # 0: no tail loss probes
HOLDER_PREFIX = "hil-rig/tail-loss-probes-off/"
UNIX_SOCKETS = Path("/proc/net/unix")  # this network namespace's sockets; abstract names start with '@'


def holders(unix_sockets: Path = UNIX_SOCKETS) -> dict[str, str]:
    """Live holders in this network namespace: bridge -> the value the box had before that rig."""
    found: dict[str, str] = {}
    for line in unix_sockets.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("@" + HOLDER_PREFIX):
            bridge, _, value = fields[7][1 + len(HOLDER_PREFIX):].rpartition("/")
            if bridge and value:
                found[bridge] = value
    return found


def state() -> str:
    """``on`` or ``off``, as the kernel has it now."""
    return "off" if EARLY_RETRANS.read_text().strip() == "0" else "on"


class TailLossProbesOff:
    """One rig's hold on ``tcp_early_retrans=0`` (module docstring)."""

    def __init__(self, bridge: str) -> None:
        self.bridge = bridge
        self._socket: socket.socket | None = None

    def take(self) -> str:
        """Turn the probes off and hold them off; returns the value to give back when the last holder goes.
        ``OSError`` if the file cannot be written (the probes stay on)."""
        current = EARLY_RETRANS.read_text().strip()
        others = {value for bridge, value in holders().items() if bridge != self.bridge}
        original = min(others) if current == "0" and others else current
        if current != "0":
            EARLY_RETRANS.write_text("0")
        held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held.bind(f"\0{HOLDER_PREFIX}{self.bridge}/{original}")
        held.listen(1)
        self._socket = held
        return original

    def release(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def restore(original: str, own_bridge: str) -> None:
    """Give the box ``original`` back, unless a live rig other than ``own_bridge``'s still holds the probes off."""
    if any(bridge != own_bridge for bridge in holders()):
        return
    if EARLY_RETRANS.read_text().strip() != original:
        EARLY_RETRANS.write_text(original)
