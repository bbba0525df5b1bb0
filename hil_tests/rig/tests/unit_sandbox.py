"""The rig under its unit's restrictions where systemd is not PID 1: the unit file's settings, made by hand.

On a machine booted by systemd, ``systemd-run -p ProtectKernelTunables=yes ...`` would apply them; test
machines and CI containers often run no systemd. So this reads ``systemd/hil-rig.service`` and builds the
same sandbox from what systemd.exec(5) says each setting does, in a private mount namespace:

* ``ProtectKernelTunables=yes``: /proc/sys is bind-mounted read-only; each ``ReadWritePaths=`` entry is
  then bound over itself writable again (a ``-`` prefix: skipped when missing), as systemd does.
* ``ProtectSystem=strict``: every other mount read-only, except the API file systems (/proc, /sys, /dev).
* ``RuntimeDirectory=``: a tmpfs on /run holding the directory, which here is a folder of the test's (so
  it outlives one rig, as ``RuntimeDirectoryPreserve=yes`` keeps it across restarts), owned by the user.
* ``User=``, ``AmbientCapabilities=``, ``CapabilityBoundingSet=``, ``NoNewPrivileges=``: setpriv, with a
  numeric user (the unit's own user does not exist on a test machine).

The command is the unit's ``ExecStart`` with ``${RIG_PORTS}`` and ``$RIG_OPTIONS`` filled in, the serial
device and the interpreter swapped for the test's, run from the checkout instead of /opt/hil-rig.
Not emulated (nothing the rig does meets them): the system call filter, device policy, ProtectHome,
PrivateTmp and the other Protect*= settings.
"""

from __future__ import annotations

import shlex
import sys
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
UNIT = REPO_ROOT / "systemd" / "hil-rig.service"
NOBODY = 65534


def unit_settings(unit: Path = UNIT) -> dict[str, list[str]]:
    """Every ``Key=value`` of the unit's [Service] section; repeated keys keep all their values in order."""
    settings: dict[str, list[str]] = defaultdict(list)
    section = ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings[key].append(value)
    return dict(settings)


def _capabilities(value: str) -> str:
    """setpriv's spelling of a unit's capability list: ``CAP_NET_ADMIN`` -> ``+net_admin``."""
    return ",".join("+" + name.lower().removeprefix("cap_") for name in value.split())


def sandboxed_command(ports: str, options: str, serial: str, runtime_dir: Path, settings: dict[str, list[str]],
                      uid: int = NOBODY) -> list[str]:
    """The argv that runs the unit's ExecStart under its restrictions (module docstring), as root in the
    current network namespace (prefix it with ``ip netns exec NS``)."""
    def one(key: str) -> str:
        return settings.get(key, [""])[-1]

    script = ["set -e"]
    if one("ProtectKernelTunables") == "yes":
        script += ["mount --bind /proc/sys /proc/sys", "mount -o remount,bind,ro /proc/sys"]
        for entry in (path for value in settings.get("ReadWritePaths", []) for path in value.split()):
            path = shlex.quote(entry.removeprefix("-"))
            writable = f"mount --bind {path} {path} && mount -o remount,bind,rw {path}"
            script.append(f"if [ -e {path} ]; then {writable}; fi" if entry.startswith("-") else writable)
    if one("ProtectSystem") == "strict":
        script.append(
            "findmnt -rn -o TARGET | grep -Ev '^/(proc|sys|dev|run)(/|$)' | while read -r target; do "
            'mount -o remount,bind,ro "$target" 2>/dev/null || true; done'
        )
    for name in settings.get("RuntimeDirectory", []):
        script += [
            "mount -t tmpfs -o mode=0755 tmpfs /run",
            f"mkdir -p /run/{name}",
            f"mount --bind {shlex.quote(str(runtime_dir))} /run/{name}",
            f"mount -o remount,bind,rw /run/{name}",
        ]
    exec_start = one("ExecStart").replace("${RIG_PORTS}", ports).replace("$RIG_OPTIONS", options)
    argv = shlex.split(exec_start)
    argv = [sys.executable if word == "/usr/bin/python3" else serial if word == "/dev/hilrig" else word for word in argv]
    privileges = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    if one("AmbientCapabilities"):
        caps = _capabilities(one("AmbientCapabilities"))
        privileges += [f"--inh-caps={caps}", f"--ambient-caps={caps}"]
    if one("CapabilityBoundingSet"):
        privileges.append(f"--bounding-set=-all,{_capabilities(one('CapabilityBoundingSet'))}")
    if one("NoNewPrivileges") == "yes":
        privileges.append("--no-new-privs")
    script.append(shlex.join(["exec", "setpriv", *privileges, "--", *argv]))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)]
