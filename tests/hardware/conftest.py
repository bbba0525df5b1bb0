"""Fixtures every hardware test shares: gpiozero's own mock pins, the AT modem emulator on a pty, and
stand-ins for the system's commands."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gpiozero import Device
from gpiozero.pins.mock import MockFactory

from tests.hardware.modem_emulator import ModemEmulator


@pytest.fixture
def factory() -> Iterator[MockFactory]:
    """Real gpiozero code on mock pins; reset after the test so no device outlives it."""
    mock = MockFactory()
    Device.pin_factory = mock
    yield mock
    mock.reset()
    Device.pin_factory = None


@pytest.fixture
def emulator() -> Iterator[ModemEmulator]:
    modem = ModemEmulator().start()
    yield modem
    modem.close()


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], None]:
    """``stand_in(command, script)``: a shell script answers for ``command`` (``timedatectl``, ``nmcli``),
    first on PATH for the rest of the test."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def install(command: str, script: str) -> None:
        tool = bin_dir / command
        tool.write_text("#!/bin/sh\n" + script)
        tool.chmod(0o755)

    return install
