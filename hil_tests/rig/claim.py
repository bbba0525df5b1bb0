"""One rig per port set: a claim on each port (and the bridge) taken before the rig changes anything.

A second rig started on ports a first one shapes used to go ahead: it deleted the first one's qdiscs and
drop table as leftovers of a killed rig, so the first rig's link went unshaped while its STATUS still said
``rate=64000 loss=50``, and its SIGTERM then failed. Now the second rig refuses, naming the port and the
rig that holds it, and touches nothing.

The claim is a listening socket in Linux's abstract unix namespace, named after the interface. That
namespace belongs to the network namespace, as the interfaces do, so rigs in different namespaces (or on
different boxes) never see each other's claims; the kernel drops the socket when the process ends however it
ends (SIGKILL, a crash), so a claim cannot outlive its rig and there is no stale lock file to clear. It
needs no file system (the unit's ``ProtectSystem=strict``) and only ``AF_UNIX``, which the unit allows. A
second rig connects to the socket to learn the holder's pid (``SO_PEERCRED``) for its error message.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterable

ADDRESS_PREFIX = "\0hil-rig/interface/"
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class PortsBusy(RuntimeError):
    """Another rig holds one of the interfaces; the message names it and that rig's pid."""


class Claim:
    """Holds ``interfaces`` for this process from `take` until `release` (or the process's end)."""

    def __init__(self, interfaces: Iterable[str]) -> None:
        self.interfaces = tuple(sorted(set(interfaces)))
        self._sockets: list[socket.socket] = []

    def take(self) -> None:
        """Claim every interface or none; `PortsBusy` if another rig holds one."""
        try:
            for name in self.interfaces:
                held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    held.bind(ADDRESS_PREFIX + name)
                except OSError as error:
                    held.close()
                    if error.errno == errno.EADDRINUSE:
                        raise PortsBusy(
                            f"{name} is already used by another rig{_holder(name)}: one rig per port set; stop "
                            f"that one first (systemctl stop hil-rig, or SIGTERM)"
                        ) from None
                    raise
                held.listen(1)
                self._sockets.append(held)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        while self._sockets:
            self._sockets.pop().close()


def _holder(name: str) -> str:
    """`` (pid N)`` for the process listening on ``name``'s claim, or nothing if it cannot be asked."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(ADDRESS_PREFIX + name)
            pid, _, _ = _PEERCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        except OSError:
            return ""
    return f" (pid {pid})"
