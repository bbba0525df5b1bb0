"""What the bridge backend changed on the rig box, on disk before each change, so that a crash can be undone.

A rig killed with SIGKILL (or a crash, or the OOM killer) cannot run its ``close()``: it left the bridge,
the qdiscs, the drop table, the address, the route and ``net.ipv4.tcp_early_retrans`` at 0, so the link
stayed dead or shaped until someone noticed, and the next rig took 0 for the box's own value and "restored"
it for good. Now every change is first written down here (write-ahead: the record names what the change
will need undone, then the change is made), and a starting rig that finds a record undoes it before it
does anything else, and says so (``restarted=1`` in STATUS). A clean stop undoes the same record and
removes the file.

The file lives in ``--state-dir`` (default ``$RUNTIME_DIRECTORY`` or ``/run/hil-rig``: the unit's
``RuntimeDirectory``, kept across
restarts by ``RuntimeDirectoryPreserve``): it describes kernel state, which a reboot clears too, so a
tmpfs that a reboot empties is the right place. Its name carries the network namespace's cookie (unique per
boot, never reused), so rigs in different namespaces keep separate records and a record never outlives its
namespace's meaning. Writes go to a temporary file that is renamed over the record, so a crash mid-write
leaves the previous record whole. A rig that cannot write there says so in one line and runs without a
record: it shapes as well, but a crash of it is not undone by the next rig.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# systemd names the unit's RuntimeDirectory in $RUNTIME_DIRECTORY; a rig started by hand uses /run/hil-rig.
DEFAULT_STATE_DIR = Path(os.environ.get("RUNTIME_DIRECTORY", "/run/hil-rig").split(":")[0])
SO_NETNS_COOKIE = getattr(socket, "SO_NETNS_COOKIE", 71)  # Linux 5.14+; Python has no name for it yet


class JournalError(RuntimeError):
    """The state file cannot be written (the message names it and the option that moves it)."""


@dataclass
class Changes:
    """What must be undone on the rig box, as far as the rig got. Each field is set before its change."""

    ports: list[str]
    bridge: str
    table: str
    created_bridge: bool = False
    enslaved: list[str] = field(default_factory=list)
    address: str | None = None  # CIDR the rig put on the bridge
    sysctls: dict[str, str] = field(default_factory=dict)  # /proc/sys path -> its value before the rig
    addrgenmodes: dict[str, str] = field(default_factory=dict)  # interface -> IPv6 address mode before the rig
    routes: list[list[str]] = field(default_factory=list)  # `ip route` arguments of routes the rig added
    mcast_snooping: str | None = None  # a reused bridge's multicast snooping before the rig ("0" or "1")
    shaped: bool = False  # tbf qdiscs on the ports

    @classmethod
    def from_record(cls, record: Any) -> Changes:
        """The changes a record describes; `ValueError` for anything the rig would not have written."""
        if not isinstance(record, dict):
            raise ValueError("not an object")
        names = {f.name: f for f in dataclasses.fields(cls)}
        if set(record) - set(names) or {"ports", "bridge", "table"} - set(record):
            raise ValueError(f"unexpected fields {sorted(set(record) ^ set(names))}")
        changes = cls(**record)
        _check(changes)
        return changes


def _check(changes: Changes) -> None:
    def strings(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)

    def string_map(value: object) -> bool:
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())

    valid = (
        strings(changes.ports) and isinstance(changes.bridge, str) and isinstance(changes.table, str)
        and isinstance(changes.created_bridge, bool) and strings(changes.enslaved)
        and (changes.address is None or isinstance(changes.address, str))
        and string_map(changes.sysctls) and string_map(changes.addrgenmodes)
        and isinstance(changes.routes, list) and all(strings(route) for route in changes.routes)
        and isinstance(changes.shaped, bool) and changes.mcast_snooping in (None, "0", "1")
        and all(path.startswith("/proc/sys/net/") and ".." not in path for path in changes.sysctls)
    )  # fmt: skip
    if not valid:
        raise ValueError("a field has the wrong type or value")


def netns_cookie() -> int:
    """The current network namespace's cookie: unique per boot, never reused (unlike its inode number)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        return int.from_bytes(probe.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")


class Journal:
    """The record of one rig's changes: ``<state_dir>/<key>-netns<cookie>.json``."""

    def __init__(self, state_dir: Path, key: str) -> None:
        self.path = state_dir / f"{key}-netns{netns_cookie()}.json"

    def load(self) -> Changes | None:
        """What a rig that did not stop left, or None. A record that does not parse raises `ValueError`."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise ValueError(f"cannot read it: {error}") from None
        return Changes.from_record(json.loads(text))

    def save(self, changes: Changes) -> None:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = self.path.with_suffix(".new")
            with open(temporary, "w") as out:
                json.dump(dataclasses.asdict(changes), out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        except OSError as error:
            raise JournalError(
                f"cannot write the state file {self.path} ({error.strerror or error}): the rig records there "
                f"what it changes, to undo it after a crash (--state-dir; the unit's RuntimeDirectory=hil-rig)"
            ) from None

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
