"""HardwareService as forwarding's link source (MockFactory pins, the pty modem emulator): forwarding
subscribes while the gateway builds its services, before ``start``, and must not see a link that the
modem has not reported yet; with a bridge driving the uplink LED, the modem's registration alone does not
light it. Its readings also go out as Prometheus text next to forwarding's metrics."""

from __future__ import annotations

import asyncio

from gpiozero.pins.mock import MockFactory

from appliance.hardware.config import GpioConfig, HardwareConfig, ModemConfig
from appliance.hardware.service import HardwareService
from appliance.prometheus import render
from tests.hardware.modem_emulator import ModemEmulator
from tests.hardware.test_service import RecordingBroker, until

UPLINK = 27


def test_listeners_from_before_start_hear_the_modem_and_the_bridge_owns_the_uplink_led(
    factory: MockFactory, emulator: ModemEmulator
) -> None:
    config = HardwareConfig(
        gpio=GpioConfig(enabled=True, uplink_led=UPLINK),
        modem=ModemConfig(enabled=True, port=emulator.port, command_timeout=0.5, poll_interval=0.2),
    )
    service = HardwareService(config, on_factory_reset=lambda: None, uplink_led_follows_modem=False)
    changes: list[bool] = []
    unsubscribe = service.on_link_change(changes.append)
    assert service.link_up is False  # a modem is configured and has said nothing yet

    async def body() -> None:
        await service.start(RecordingBroker())
        try:
            await until(lambda: changes == [True])
            await until(lambda: service.modem is not None and service.modem.status.operator is not None)
            text = render(await service.metrics())
            assert "appliance_modem_registered 1\n" in text and "appliance_modem_rssi_dbm -71\n" in text
            assert 'appliance_modem_info{registration="CEREG=home,CREG=home",operator="Emu Mobile",technology="LTE"} 1' in text
            assert factory.pin(UPLINK).state is False  # registered, but the bridge has not connected
            service.show_uplink(True)
            assert factory.pin(UPLINK).state is True
            emulator.creg = emulator.cereg = 0
            emulator.send_urc("+CREG: 0")
            emulator.send_urc("+CEREG: 0")
            await until(lambda: changes == [True, False])
            assert factory.pin(UPLINK).state is True  # only the bridge turns it off (it disconnects on this)
            unsubscribe()
            emulator.creg = 1
            emulator.send_urc("+CREG: 1")
            await until(lambda: service.link_up)
            assert changes == [True, False]  # unsubscribed
        finally:
            await service.stop()

    asyncio.run(body())
