"""HardwareService with everything fitted: MockFactory pins and the pty modem emulator.

The broker is not part of this test: ``RecordingBroker`` is the smallest ``BrokerHandle`` that keeps what
the service publishes (the broker's own tests cover routing those messages).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from gpiozero.pins.mock import MockFactory

from appliance.hardware.config import GpioConfig, HardwareConfig, ModemConfig
from appliance.hardware.service import HardwareService
from tests.hardware.modem_emulator import ModemEmulator
from tests.support.waiting import until

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
