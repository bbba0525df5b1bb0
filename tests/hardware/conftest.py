"""Fixtures every hardware test shares: gpiozero's own mock pins and the AT modem emulator on a pty."""

from __future__ import annotations

from collections.abc import Iterator

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
