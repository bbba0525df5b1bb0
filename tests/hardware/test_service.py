"""HardwareService with everything fitted: MockFactory pins and the pty modem emulator.

The broker is not part of this test: ``RecordingBroker`` is the smallest ``BrokerHandle`` that keeps what
the service publishes (the broker's own tests cover routing those messages).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from gpiozero import LED, Button, Device
from gpiozero.pins.mock import MockFactory

from appliance.hardware.config import GpioConfig, HardwareConfig, ModemConfig
from appliance.hardware.service import HardwareService
from appliance.prometheus import Family
from testing.waiting import until
from tests.hardware.modem_emulator import ModemEmulator

UPLINK, BUTTON, RELAY = 27, 23, 24


class RecordingBroker:
    def __init__(self) -> None:
        self.retained: dict[str, bytes] = {}

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, **properties: object) -> None:
        assert retain and qos == 0
        self.retained[topic] = payload

    def disconnect(self, client_id: str, reason_code: int, reason_string: str | None = None) -> None:
        raise AssertionError("the hardware service never disconnects clients")

    def may_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return True

    def prometheus(self) -> str:
        return ""




def test_everything_disabled_opens_nothing_and_never_holds_forwarding_back() -> None:
    async def body() -> None:
        service = HardwareService(HardwareConfig(), on_factory_reset=lambda: None)
        await service.start(RecordingBroker())
        service.show_ready()
        service.show_backlog(5)
        assert service.panel is None and service.modem is None and service.link_up
        await service.stop()

    asyncio.run(body())


def test_modem_readings_are_published_and_drive_the_uplink_led_and_buttons_work(
    factory: MockFactory, emulator: ModemEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    config = HardwareConfig(
        gpio=GpioConfig(enabled=True, uplink_led=UPLINK, button=BUTTON, modem_relay=RELAY, long_press_seconds=0.2),
        modem=ModemConfig(enabled=True, port=emulator.port, command_timeout=0.5, poll_interval=0.2),
    )
    resets: list[str] = []
    broker = RecordingBroker()

    async def body() -> None:
        service = HardwareService(config, on_factory_reset=lambda: resets.append("requested"), status_report=lambda: {"clients": 3})
        await service.start(broker)
        link: list[bool] = []
        service.on_link_change(link.append)
        try:
            await until(lambda: service.link_up)
            assert link == [True] and factory.pin(UPLINK).state is True
            assert broker.retained["$SYS/gateway/modem/operator"] == b"Emu Mobile"
            assert broker.retained["$SYS/gateway/modem/registered"] == b"true"
            assert broker.retained["$SYS/gateway/modem/rssi_dbm"] == b"-71"

            button = factory.pin(BUTTON)
            service.show_backlog(7)  # what the forwarding pipeline reports as its queue depth
            with caplog.at_level(logging.INFO, logger="appliance.hardware.service"):
                button.drive_low()
                button.drive_high()
                await until(lambda: "status: clients=3, backlog=7" in caplog.text)
            assert "modem_operator=Emu Mobile" in caplog.text

            button.drive_low()
            await until(lambda: bool(resets))
            button.drive_high()
            service.request_factory_reset()  # a second request while the first is under way is ignored
        finally:
            await service.stop()

    asyncio.run(body())
    assert resets == ["requested"]  # the gateway does the reset itself: test_gateway_wiring.py


def samples(families: list[Family], name: str) -> dict[str, float]:
    family = next(family for family in families if family.name == name)
    return {labels.get("part", ""): value for labels, value in family.samples}


def test_no_pin_library_on_this_machine_leaves_the_gateway_running_without_its_panel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What a PC, a VM or a container is: gpiozero finds no pin library. The service starts without the
    panel, says so once, and reports the part as missing; the LED calls are no-ops."""
    monkeypatch.setattr(Device, "pin_factory", None)
    monkeypatch.setenv("GPIOZERO_PIN_FACTORY", "no-such-pin-library")
    config = HardwareConfig(gpio=GpioConfig(enabled=True, power_led=17, uplink_led=UPLINK, button=BUTTON))

    async def body() -> None:
        service = HardwareService(config, on_factory_reset=lambda: None)
        with caplog.at_level(logging.WARNING, logger="appliance.hardware.service"):
            await service.start(RecordingBroker())
        service.show_ready()
        service.show_uplink(True)
        service.show_backlog(3)
        assert service.panel is None and service.link_up
        assert samples(await service.metrics(), "appliance_hardware_available") == {"gpio": 0}
        await service.stop()

    asyncio.run(body())
    assert [record.getMessage() for record in caplog.records] == [
        "GPIO not available, running without status LEDs, button and modem relay: "
        "BadPinFactory: Unable to find pin factory 'no-such-pin-library'"
    ]


def test_a_pin_held_by_another_program_releases_the_pins_already_claimed_and_the_modem_still_works(
    factory: MockFactory, emulator: ModemEmulator
) -> None:
    """The button's pin is taken: no panel (so no relay either), the LED pins claimed before it are free
    again, and the modem is watched without a relay."""
    other_program = Button(BUTTON)
    config = HardwareConfig(
        gpio=GpioConfig(enabled=True, power_led=17, uplink_led=UPLINK, button=BUTTON, modem_relay=RELAY),
        modem=ModemConfig(enabled=True, port=emulator.port, command_timeout=0.5, poll_interval=0.2),
    )
    broker = RecordingBroker()

    async def body() -> None:
        service = HardwareService(config, on_factory_reset=lambda: None)
        await service.start(broker)
        try:
            await until(lambda: service.link_up)
            assert service.panel is None
            assert samples(await service.metrics(), "appliance_hardware_available") == {"gpio": 0, "modem": 1}
            assert broker.retained["$SYS/gateway/modem/registered"] == b"true"
        finally:
            await service.stop()

    asyncio.run(body())
    for pin in (17, UPLINK, RELAY):
        LED(pin).close()  # claimable again: StatusPanel closed what it had claimed before the failure
    other_program.close()


def test_a_modem_port_that_is_not_there_is_reported_missing_and_does_not_gate_the_link(tmp_path: Path) -> None:
    config = HardwareConfig(modem=ModemConfig(enabled=True, port=str(tmp_path / "ttyUSB2"), poll_interval=0.2))

    async def body() -> None:
        service = HardwareService(config, on_factory_reset=lambda: None)
        link: list[bool] = []
        service.on_link_change(link.append)
        await service.start(RecordingBroker())
        try:
            await until(lambda: service.link_up)
            assert link == [True]
            assert samples(await service.metrics(), "appliance_hardware_available") == {"modem": 0}
        finally:
            await service.stop()

    asyncio.run(body())
