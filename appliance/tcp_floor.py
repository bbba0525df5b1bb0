"""TCP's retransmission floor: raised for the slow uplink by the image, kept at the kernel's for the LAN.

Linux retransmits a segment when no acknowledgement came within its retransmission timeout, at least
``rto_min`` (200 ms by default) above the smoothed round trip. On a fast uplink the round trip is
milliseconds, so the timeout is ~200 ms. When the modem's rate then drops (to 9.6 kbit/s, a 1514-byte
frame takes 1.26 s) every segment already queued in the modem outlasts that timeout: TCP retransmits
data that was never lost, each copy takes its own turn on the slow link, the backed-off timer stalls the
sender, and the round trips of the segments behind the copies grow again, so an alert raised then waits
seconds behind them (measured on the HIL bridge bench: docs/forwarding.md "Retransmission floor").

A socket cannot raise its own floor: ``TCP_RTO_MIN_US`` (Linux 6.15+) accepts at most the kernel's 200 ms
(EINVAL above, measured on 6.18), and a route's ``rto_min`` or eBPF needs CAP_NET_ADMIN, which the
gateway's service user does not have. The floor for new sockets is the per-namespace sysctl
``net.ipv4.tcp_rto_min_us`` (Linux 6.11+), so the gateway image raises it for the slowest uplink it
expects (``images/gateway/rootfs/etc/sysctl.d/``), and the gateway lowers it back on the sockets that never
cross the uplink - its broker's listeners, whose accepted LAN connections inherit the listener's floor -
because a set point lost on Wi-Fi must not wait seconds for its retransmission.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Any

#: ``TCP_RTO_MIN_US`` from linux/tcp.h (Python's socket module does not name it yet).
TCP_RTO_MIN_US = getattr(socket, "TCP_RTO_MIN_US", 45)
#: The kernel's own floor (``TCP_RTO_MIN``), and the most ``TCP_RTO_MIN_US`` accepts.
KERNEL_RTO_MIN_US = 200_000
#: The namespace's floor for new sockets (Linux 6.11+), what the image raises.
FLOOR_SYSCTL = Path("/proc/sys/net/ipv4/tcp_rto_min_us")


def keep_kernel_floor(sock: Any) -> bool:
    """Give ``sock`` (a listener: its accepted sockets inherit it) the kernel's own 200 ms floor, whatever
    the namespace's is. False where the kernel has no ``TCP_RTO_MIN_US`` (before 6.15, e.g. a Pi's 6.12):
    the socket keeps the namespace's floor."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US, KERNEL_RTO_MIN_US)
    except OSError as exc:
        if exc.errno not in (errno.ENOPROTOOPT, errno.EINVAL, errno.EOPNOTSUPP):
            raise
        return False
    return True


def retransmission_floor_s(sock: Any) -> float | None:
    """The floor ``sock`` retransmits above, in seconds: its own (6.15+), else the namespace's (6.11+);
    None where the kernel tells neither."""
    try:
        return int(sock.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US)) / 1e6
    except OSError:
        pass
    try:
        return int(FLOOR_SYSCTL.read_text()) / 1e6
    except (OSError, ValueError):
        return None
