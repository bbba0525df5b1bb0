"""``appliance-boot-state``, RAUC's custom bootloader backend on the gateway, run as RAUC runs it on a real
state file (``APPLIANCE_BOOT_STATE`` points it at a temporary one instead of ``/boot/firmware/gw-boot.env``).
The file's format is the one U-Boot's ``env export -t`` writes and ``env import -t`` reads in boot.cmd."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from testing.campaigns import campaign

SCRIPT = Path(__file__).resolve().parents[2] / "images/gateway/image-rootfs/usr/local/sbin/appliance-boot-state"


def backend(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, "APPLIANCE_BOOT_STATE": str(state)})


def test_without_a_state_file_the_boot_scripts_defaults_stand(tmp_path: Path) -> None:
    state = tmp_path / "gw-boot.env"
    assert backend(state, "get-primary").stdout == "A\n"
    assert backend(state, "get-state", "B").stdout == "good\n"
    assert not state.exists()  # reading writes nothing


def test_an_install_into_b_makes_it_primary_with_all_its_attempts(tmp_path: Path) -> None:
    state = tmp_path / "gw-boot.env"
    state.write_text("BOOT_ORDER=A B\nBOOT_A_LEFT=2\nBOOT_B_LEFT=0\n")
    assert backend(state, "set-primary", "B").returncode == 0
    assert state.read_text() == "BOOT_ORDER=B A\nBOOT_A_LEFT=2\nBOOT_B_LEFT=3\n"
    assert backend(state, "get-primary").stdout == "B\n"


def test_a_slot_whose_attempts_are_spent_is_bad_and_the_other_is_primary(tmp_path: Path) -> None:
    state = tmp_path / "gw-boot.env"
    state.write_text("BOOT_ORDER=B A\nBOOT_A_LEFT=3\nBOOT_B_LEFT=0\n")  # B booted three times, never marked good
    assert backend(state, "get-state", "B").stdout == "bad\n"
    assert backend(state, "get-primary").stdout == "A\n"


def test_marking_good_gives_the_attempts_back_and_bad_takes_them(tmp_path: Path) -> None:
    state = tmp_path / "gw-boot.env"
    state.write_text("BOOT_ORDER=B A\nBOOT_A_LEFT=3\nBOOT_B_LEFT=1\n")
    assert backend(state, "set-state", "B", "good").returncode == 0
    assert "BOOT_B_LEFT=3\n" in state.read_text()
    assert backend(state, "set-state", "A", "bad").returncode == 0
    assert "BOOT_A_LEFT=0\n" in state.read_text()
    assert backend(state, "get-primary").stdout == "B\n"
    assert not (tmp_path / "gw-boot.env.new").exists()


@pytest.mark.parametrize("args", [("set-primary", "C"), ("get-state", ""), ("set-state", "A", "maybe"), ("explode",)])
def test_bad_arguments_are_refused_and_change_nothing(tmp_path: Path, args: tuple[str, ...]) -> None:
    state = tmp_path / "gw-boot.env"
    state.write_text("BOOT_ORDER=A B\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n")
    result = backend(state, *args)
    assert result.returncode == 2 and result.stderr
    assert state.read_text() == "BOOT_ORDER=A B\nBOOT_A_LEFT=3\nBOOT_B_LEFT=3\n"


@campaign(40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.sampled_from("BOOT_ORDERLFAB=0123456789 $;`()\n'\"x"), max_size=120))
def test_a_hostile_state_file_runs_nothing_and_still_names_a_slot(tmp_path: Path, text: str) -> None:
    state = tmp_path / "gw-boot.env"
    state.write_text(text)
    result = backend(state, "get-primary")
    assert result.returncode in (0, 1)
    assert result.stdout in ("A\n", "B\n", "")
    assert not list(tmp_path.glob("x*"))  # no command from the file ran (`touch x` and the like)
