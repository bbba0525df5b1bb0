"""Which A/B root slot this machine booted, and which version RAUC installed there.

The gateway image updates itself with RAUC into two root slots (``images/gateway/README.md``, "A/B
updates"). The boot script tells the kernel which slot it chose with ``rauc.slot=A`` (or ``B``) on the
command line, the way RAUC itself finds the booted slot; the slot's name and the version of the bundle
written into it are in RAUC's own files: ``/etc/rauc/system.conf`` (``[slot.rootfs.0]`` with
``bootname=A``) and the central status file it names (``statusfile=``, a key file with a
``[slot.rootfs.0]`` group holding ``bundle.version``). Reading the files, not asking the RAUC service
over D-Bus, keeps ``appliance doctor`` and the gateway's metrics page free of a D-Bus client and of the
service's policy; the files are written only by ``rauc install``, never while one is read here.

A machine booted without ``rauc.slot=`` (a developer's, a container) has no slot: ``None``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.prometheus import Family, gauge

if TYPE_CHECKING:
    from configparser import ConfigParser

CMDLINE = Path("/proc/cmdline")
SYSTEM_CONF = Path("/etc/rauc/system.conf")


@dataclass(frozen=True)
class BootedSlot:
    bootname: str  # as U-Boot and the kernel command line name it: "A", "B"
    name: str | None  # RAUC's slot name ("rootfs.0"), None if system.conf does not know the bootname
    version: str | None  # the version of the bundle installed into it; None for the slot flashed at the factory


def bootname_from_cmdline(cmdline: str) -> str | None:
    for word in cmdline.split():
        if word.startswith("rauc.slot="):
            return word.removeprefix("rauc.slot=") or None
    return None


def _key_file(text: str) -> ConfigParser | None:
    """RAUC's files are GLib key files: ``[group]`` and ``key=value``, values taken as written; ``None`` if
    ``text`` is not one. ``configparser`` is imported here, not with the module: only a machine booted
    from a slot reads these files, and every gateway start imports this module (about 1 ms of CPU)."""
    import configparser

    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    return parser


def booted_slot(cmdline: str, system_conf: str, status: str | None) -> BootedSlot | None:
    """The slot named by ``rauc.slot=`` in ``cmdline``, looked up in ``system_conf`` and ``status`` (the
    contents of the central status file, ``None`` if there is none yet). Unreadable key files leave the
    name or the version unknown rather than failing: this only informs."""
    bootname = bootname_from_cmdline(cmdline)
    if bootname is None:
        return None
    name = None
    conf = _key_file(system_conf)
    if conf is None:
        return BootedSlot(bootname, None, None)
    for group in conf.sections():
        if group.startswith("slot.") and conf.get(group, "bootname", fallback=None) == bootname:
            name = group.removeprefix("slot.")
    version = None
    status_groups = _key_file(status) if name is not None and status is not None else None
    if status_groups is not None:
        version = status_groups.get(f"slot.{name}", "bundle.version", fallback=None)
    return BootedSlot(bootname, name, version)


def status_file(system_conf: str) -> Path | None:
    """Where ``system.conf`` keeps RAUC's central status file (``[system] statusfile=``)."""
    conf = _key_file(system_conf)
    value = conf.get("system", "statusfile", fallback=None) if conf is not None else None
    return Path(value) if value and value != "per-slot" else None


def read_booted_slot(cmdline: Path = CMDLINE, system_conf: Path = SYSTEM_CONF) -> BootedSlot | None:
    """This machine's booted slot from the running kernel's command line and RAUC's files."""
    try:
        bootname = bootname_from_cmdline(cmdline.read_text())
    except OSError:
        return None
    if bootname is None:
        return None
    try:
        conf_text = system_conf.read_text()
    except OSError:
        return BootedSlot(bootname, None, None)
    status_path = status_file(conf_text)
    try:
        status = status_path.read_text() if status_path is not None else None
    except OSError:
        status = None
    return booted_slot(f"rauc.slot={bootname}", conf_text, status)


def slot_families(slot: BootedSlot | None) -> list[Family]:
    """``appliance_system_slot_info{slot, rauc_slot, version} 1`` for the metrics page; nothing off an A/B system."""
    if slot is None:
        return []
    return [gauge(
        "appliance_system_slot_info", "The A/B root slot this machine booted and the bundle version installed in it",
        1, slot=slot.bootname, rauc_slot=slot.name or "", version=slot.version or "",
    )]


def slot_collector(slot: BootedSlot | None) -> Callable[[], Awaitable[Sequence[Family]]]:
    """A metrics collector for the slot read once at start: it cannot change without a reboot."""
    families = slot_families(slot)

    async def collect() -> Sequence[Family]:
        return families

    return collect
