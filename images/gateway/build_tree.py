"""Stage the gateway's root filesystem tree: ``python images/gateway/build_tree.py --wheel W --out DIR``.

One builder serves both uses, so CI checks the same layout the image gets:

* the pi-gen stage (``stage-gateway/00-gateway/00-run.sh``) copies the tree into the image's root and then
  creates the venv inside the chroot, with the ARM interpreter and the wheel's dependencies from PyPI;
* ``make image-tree`` passes ``--host-venv`` to also create ``/opt/appliance/venv`` with this machine's
  interpreter and the wheel alone (no dependencies, no network), so the tree has the real entry point the
  unit starts and tests can check every path the units and the config name.

Layout (read-only-root friendly: nothing under it is written at run time except by provisioning):

    /opt/appliance/wheels/       the wheel, kept so the venv can be rebuilt offline
    /opt/appliance/venv/         the gateway (--host-venv here, the chroot on the image)
    /opt/appliance/docs/         docs the units name in Documentation=
    /etc/appliance/              gateway.toml, passwd (provisioning fills in id and accounts)
    /usr/lib/systemd/system/     appliance.service, appliance-firstboot.service (+ enable symlinks)
    /usr/lib/sysusers.d/         appliance.conf: the dedicated user and its groups
    /usr/local/sbin/             appliance-firstboot
    /etc/udev/rules.d/           77-appliance-modem.rules: the modem's AT port for the gateway, not ModemManager
    /var/lib/appliance           not shipped: systemd creates it (StateDirectory=)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
VENV = Path("opt/appliance/venv")
UNITS = ("appliance.service", "appliance-firstboot.service")


def build_tree(wheel: Path, out: Path, host_venv: bool) -> None:
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(HERE / "rootfs", out, symlinks=True)
    units = out / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    wants = out / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    for unit in UNITS:
        shutil.copy2(PROJECT / "systemd" / unit, units / unit)
        # What `systemctl enable` does, without needing systemctl on the build machine.
        (wants / unit).symlink_to(f"/usr/lib/systemd/system/{unit}")
    sysusers = out / "usr/lib/sysusers.d"
    sysusers.mkdir(parents=True)
    shutil.copy2(PROJECT / "systemd/appliance.sysusers", sysusers / "appliance.conf")
    docs = out / "opt/appliance/docs"
    docs.mkdir(parents=True)
    shutil.copy2(PROJECT / "docs/hardware.md", docs / "hardware.md")
    wheels = out / "opt/appliance/wheels"
    wheels.mkdir(parents=True)
    shutil.copy2(wheel, wheels / wheel.name)
    (out / "etc/appliance").chmod(0o755)  # as ConfigurationDirectoryMode= in the unit
    for config in (out / "etc/appliance").iterdir():
        config.chmod(0o640)
    if host_venv:
        make_host_venv(out / VENV, wheels / wheel.name)


def make_host_venv(venv: Path, wheel: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "--quiet", "--no-deps", "--no-compile", str(wheel)],
        check=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the appliance wheel to install")
    parser.add_argument("--out", type=Path, required=True, help="where to stage the tree (replaced)")
    parser.add_argument("--host-venv", action="store_true", help="also create the venv with this interpreter")
    args = parser.parse_args(argv)
    build_tree(args.wheel, args.out, args.host_venv)
    print(f"staged {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
