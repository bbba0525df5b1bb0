"""``appliance.system_slot``: the booted A/B slot and its version from the kernel command line and RAUC's
files, as ``appliance doctor`` and the metrics page show them. Real files in a temporary directory; the
system.conf is the image's own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.doctor import check_system_slot
from appliance.findings import Verdict
from appliance.prometheus import render
from appliance.system_slot import BootedSlot, booted_slot, bootname_from_cmdline, read_booted_slot, slot_collector

PROJECT = Path(__file__).resolve().parents[2]
IMAGE_SYSTEM_CONF = PROJECT / "images/gateway/image-rootfs/etc/rauc/system.conf"
STATUS = "[slot.rootfs.1]\nbundle.compatible=appliance-gateway-arm64\nbundle.version=2.0.0\nstatus=ok\n"


@pytest.fixture
def machine(tmp_path: Path) -> tuple[Path, Path]:
    """A /proc/cmdline and a system.conf (the image's, its status file moved under ``tmp_path``)."""
    conf = IMAGE_SYSTEM_CONF.read_text()
    status = tmp_path / "central.raucs"
    lines = [f"statusfile={status}" if line.startswith("statusfile=") else line for line in conf.splitlines()]
    (tmp_path / "system.conf").write_text("\n".join(lines) + "\n")
    return tmp_path / "cmdline", tmp_path / "system.conf"


def test_the_slot_booted_by_the_boot_script_with_the_version_rauc_installed(machine: tuple[Path, Path]) -> None:
    cmdline, conf = machine
    cmdline.write_text("root=PARTUUID=47617465-03 rauc.slot=B rootwait console=ttyAMA0\n")
    (cmdline.parent / "central.raucs").write_text(STATUS)
    slot = read_booted_slot(cmdline, conf)
    assert slot == BootedSlot("B", "rootfs.1", "2.0.0")
    [finding] = check_system_slot(slot)
    assert finding.verdict is Verdict.OK and "slot B (rootfs.1), version 2.0.0" in finding.message


def test_the_slot_flashed_at_the_factory_has_no_bundle_version(machine: tuple[Path, Path]) -> None:
    cmdline, conf = machine
    cmdline.write_text("rauc.slot=A root=PARTUUID=47617465-02\n")
    slot = read_booted_slot(cmdline, conf)  # no status file yet: nothing was ever installed
    assert slot == BootedSlot("A", "rootfs.0", None)
    assert "as flashed" in check_system_slot(slot)[0].message


def test_a_machine_not_booted_through_the_boot_script_has_no_slot(machine: tuple[Path, Path]) -> None:
    cmdline, conf = machine
    cmdline.write_text("root=/dev/vda2 console=ttyAMA0\n")
    assert read_booted_slot(cmdline, conf) is None
    assert check_system_slot(None) == []
    assert read_booted_slot(cmdline.parent / "missing", conf) is None


def test_a_bootname_rauc_does_not_know_is_a_problem(machine: tuple[Path, Path]) -> None:
    cmdline, conf = machine
    cmdline.write_text("rauc.slot=C\n")
    slot = read_booted_slot(cmdline, conf)
    assert slot == BootedSlot("C", None, None)
    assert check_system_slot(slot)[0].verdict is Verdict.PROBLEM


def test_the_metrics_page_shows_slot_and_version() -> None:
    collect = slot_collector(BootedSlot("B", "rootfs.1", "2.0.0"))
    page = render(asyncio.run(collect()))
    assert 'appliance_system_slot_info{slot="B",rauc_slot="rootfs.1",version="2.0.0"} 1' in page
    assert render(asyncio.run(slot_collector(None)())) == ""


@given(st.text(max_size=300), st.text(max_size=300))
def test_hostile_rauc_files_inform_less_and_never_raise(system_conf: str, status: str) -> None:
    slot = booted_slot("rauc.slot=A", system_conf, status)
    assert slot is not None and slot.bootname == "A"


@given(st.text(max_size=200))
def test_any_command_line_gives_a_bootname_or_none(cmdline: str) -> None:
    name = bootname_from_cmdline(cmdline)
    assert name is None or (name and " " not in name)
