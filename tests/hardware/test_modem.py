"""The modem driver and monitor against ``ModemEmulator`` on a real pty pair, with the relay on gpiozero's
``MockFactory``: the relay's output pin is wired (``MockConnectedPin``) to an input the emulator watches,
so a power cycle really reaches the "modem".

Timeouts, backoffs and the relay's off time are judged on the fake runtime (``testing/fake_runtime.py``):
its clock stands still while the emulator answers in real time, so a reply is never late, and moves only
when the test moves it, so each deadline is checked to the millisecond instead of within a real-time bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gpiozero import Device, DigitalInputDevice
from gpiozero.pins.mock import MockConnectedPin, MockFactory

from appliance.hardware.config import ModemConfig
from appliance.hardware.gpio import ModemPowerRelay
from appliance.hardware.modem import AtChannel, ModemMonitor, ModemTimeout
from appliance.hardware.modem_status import Registration
from testing.fake_runtime import FakeRuntime
from testing.waiting import until
from tests.hardware.modem_emulator import ModemEmulator

RELAY_PIN, SENSE_PIN = 24, 25


@pytest.fixture
def relay(emulator: ModemEmulator) -> Iterator[ModemPowerRelay]:
    factory = MockFactory()
    Device.pin_factory = factory
    sense = factory.pin(SENSE_PIN)
    factory.pin(RELAY_PIN, pin_class=MockConnectedPin, input_pin=sense)
    power_sense = DigitalInputDevice(SENSE_PIN)
    power_sense.when_deactivated = emulator.power_off
    power_sense.when_activated = emulator.power_on
    relay = ModemPowerRelay(RELAY_PIN, active_high=True)
    yield relay
    relay.close()
    power_sense.close()
    factory.reset()
    Device.pin_factory = None


def config(port: str, **changes: float) -> ModemConfig:
    values = dict(
        enabled=True,
        port=port,
        command_timeout=0.3,
        poll_interval=0.2,
        power_off_seconds=0.05,
        ready_timeout=1.0,
        backoff_initial=0.2,
        backoff_max=0.4,
    )
    values.update(changes)
    return ModemConfig(**values)  # type: ignore[arg-type]




async def with_monitor(monitor: ModemMonitor, body: Callable[[], object]) -> None:
    task = asyncio.create_task(monitor.run())
    try:
        await body()  # type: ignore[misc]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_poll_reads_signal_registration_operator_and_reports_link_up(emulator: ModemEmulator) -> None:
    monitor = ModemMonitor(config(emulator.port))
    changes: list[bool] = []
    monitor.on_link_change(changes.append)

    async def body() -> None:
        await until(lambda: monitor.link_up)

    asyncio.run(with_monitor(monitor, body))
    assert changes == [True]
    metrics = monitor.status.as_metrics()
    assert metrics["rssi_dbm"] == -113 + 2 * 21
    assert metrics["operator"] == "Emu Mobile"
    assert metrics["technology"] == "LTE"
    assert monitor.status.registration == {"CREG": Registration.HOME, "CEREG": Registration.HOME}
    assert emulator.commands[:3] == ["ATE0", "AT+CREG=1", "AT+CEREG=1"]


def test_garbage_split_replies_and_urcs_inside_replies_do_not_confuse_the_driver(emulator: ModemEmulator) -> None:
    emulator.garbage = b"\x00\xfe#\xff\r\n~~\r\n"
    emulator.split_replies = True
    emulator.urc_inside_reply = '+CMTI: "SM",3'
    emulator.csq = "10,2"

    async def body() -> None:
        urcs: list[str] = []
        channel = AtChannel(emulator.port, 115200, urcs.append)
        channel.open()
        try:
            response = await channel.command("AT+CSQ", 2.0)  # echo still on here
            assert response.ok and response.lines == ("+CSQ: 10,2",)
            assert urcs == ['+CMTI: "SM",3']
            error = await channel.command("AT+NOPE", 2.0)
            assert not error.ok and error.result == "ERROR"
        finally:
            channel.close()

    asyncio.run(body())


def test_registration_urcs_move_the_link_between_polls(emulator: ModemEmulator) -> None:
    monitor = ModemMonitor(config(emulator.port, poll_interval=30.0))
    changes: list[bool] = []
    monitor.on_link_change(changes.append)

    async def body() -> None:
        await until(lambda: monitor.link_up)
        emulator.creg = emulator.cereg = 2  # the next poll must not undo the URC's news
        emulator.send_urc("+CEREG: 2")
        await until(lambda: not monitor.link_up, timeout=2.0)
        emulator.creg = emulator.cereg = 5
        emulator.send_urc("+CEREG: 5")
        await until(lambda: monitor.link_up, timeout=2.0)

    asyncio.run(with_monitor(monitor, body))
    assert changes == [True, False, True]
    assert monitor.status.registration["CEREG"] is Registration.ROAMING


class TimedRelay:
    """The relay as the monitor's power switch, noting on the fake clock when each cycle cuts and restores."""

    def __init__(self, relay: ModemPowerRelay, runtime: FakeRuntime) -> None:
        relay.runtime = runtime
        self.relay, self.runtime = relay, runtime
        self.cut: list[float] = []
        self.restored: list[float] = []

    async def power_cycle(self, off_seconds: float) -> None:
        self.cut.append(self.runtime.monotonic())
        await self.relay.power_cycle(off_seconds)
        self.restored.append(self.runtime.monotonic())


def test_a_hung_modem_is_power_cycled_and_comes_back(emulator: ModemEmulator, relay: ModemPowerRelay) -> None:
    changes: list[bool] = []
    boots_before = emulator.boots  # the relay's initial "on" already booted it once

    async def main() -> TimedRelay:
        runtime = FakeRuntime.on_running_loop()
        switch = TimedRelay(relay, runtime)
        monitor = ModemMonitor(config(emulator.port), power_switch=switch, runtime=runtime)
        monitor.on_link_change(changes.append)

        async def body() -> None:
            await until(lambda: monitor.link_up)
            emulator.hung = True
            await runtime.run_until(lambda: not monitor.link_up, within=2.0)  # two unanswered commands
            await runtime.run_until(lambda: bool(switch.restored), within=1.0)
            await until(lambda: monitor.link_up)  # it boots, says RDY and answers: in real time, clock still

        await with_monitor(monitor, body)
        assert emulator.boots == boots_before + 1 and monitor.status.power_cycles == 1
        return switch

    switch = asyncio.run(main())
    assert changes == [True, False, True]
    assert relay.powered
    assert [b - a for a, b in zip(switch.cut, switch.restored, strict=True)] == pytest.approx([0.05], abs=1e-9)
    relay_pin = Device.pin_factory.pin(RELAY_PIN)  # type: ignore[union-attr]
    assert [state.state for state in relay_pin.states[-2:]] == [False, True]  # initial high, then off, then on


def test_a_modem_that_stays_dead_is_retried_with_growing_backoff(emulator: ModemEmulator, relay: ModemPowerRelay) -> None:
    """Each attempt: the relay off for ``power_off_seconds``, ``ready_timeout`` to come back, then a
    backoff that doubles (0.2 s, then 0.4 s, the ceiling): the cycles start exactly that far apart."""

    async def main() -> tuple[ModemMonitor, TimedRelay]:
        runtime = FakeRuntime.on_running_loop()
        switch = TimedRelay(relay, runtime)
        monitor = ModemMonitor(config(emulator.port, ready_timeout=0.4), power_switch=switch, runtime=runtime)

        async def body() -> None:
            await until(lambda: monitor.link_up)
            emulator.stays_dead = True
            emulator.hung = True
            await runtime.run_until(lambda: len(switch.cut) >= 4, within=10.0)

        await with_monitor(monitor, body)
        return monitor, switch

    monitor, switch = asyncio.run(main())
    assert not monitor.link_up and not monitor.status.responding
    gaps = [later - earlier for earlier, later in zip(switch.cut, switch.cut[1:], strict=False)]
    assert gaps == pytest.approx([0.05 + 0.4 + 0.2, 0.05 + 0.4 + 0.4, 0.05 + 0.4 + 0.4], abs=1e-9)  # float sums only


def test_a_command_to_a_hung_modem_times_out(emulator: ModemEmulator) -> None:
    emulator.hung = True

    async def body() -> None:
        runtime = FakeRuntime.on_running_loop()
        channel = AtChannel(emulator.port, 115200, lambda line: None, runtime)
        channel.open()
        try:
            command = asyncio.create_task(channel.command("AT", 0.2))
            await runtime.sleeper()  # written, waiting for its answer
            await runtime.elapse(0.199)
            assert not command.done()  # never before the deadline
            await runtime.elapse(0.001)
            with pytest.raises(ModemTimeout):
                await command
            emulator.hung = False
            assert (await channel.command("AT", 2.0)).ok  # the abandoned command left no stale state
        finally:
            channel.close()

    asyncio.run(body())


def test_a_cancel_in_the_turn_news_arrives_still_stops_the_monitor(emulator: ModemEmulator) -> None:
    """The monitor's waits must not swallow a cancellation that lands in the same loop turn as the event
    they wait for (``asyncio.wait_for`` on 3.11 does: the monitor then loops on and shutdown hangs)."""
    monitor = ModemMonitor(config(emulator.port))

    async def body() -> None:
        waiting = asyncio.create_task(monitor._wait_for_news(5.0))
        await asyncio.sleep(0)  # the task now waits on the news event
        monitor._news.set()  # what the RDY URC does
        waiting.cancel()  # the gateway stopping, in that same turn
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(body())


def test_a_port_that_is_not_there_does_not_hold_forwarding_back_and_is_taken_up_when_it_appears(
    emulator: ModemEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No modem fitted (or not enumerated yet): one warning, no power cycles, the link is not gated; when the
    port appears the modem is used, and the link waits for its registration like any modem's."""
    port = tmp_path / "ttyUSB2"
    changes: list[bool] = []
    monitors: list[ModemMonitor] = []

    async def main() -> None:
        runtime = FakeRuntime.on_running_loop()
        monitor = ModemMonitor(config(str(port)), runtime=runtime)
        monitor.on_link_change(changes.append)
        monitors.append(monitor)

        async def body() -> None:
            await until(lambda: monitor.present is False and monitor.link_up)
            emulator.creg = emulator.cereg = 2  # searching: once the port opens, the link must go down
            await runtime.sleeper()
            await runtime.elapse(4 * 0.2)  # several retries of the port (poll_interval 0.2 s): still one warning
            assert monitor.present is False
            port.symlink_to(emulator.port)
            await runtime.elapse(0.2)  # the next retry opens it
            await until(lambda: monitor.present is True and not monitor.link_up, timeout=3.0)
            emulator.creg = emulator.cereg = 1
            emulator.send_urc("+CEREG: 1")
            await until(lambda: monitor.link_up, timeout=3.0)

        await with_monitor(monitor, body)

    with caplog.at_level(logging.INFO, logger="appliance.hardware.modem"):
        asyncio.run(main())
    monitor = monitors[0]
    assert changes == [True, False, True]
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [record.getMessage() for record in warnings] == [
        f"modem port {port} does not open ([Errno 2] could not open port {port}: [Errno 2] No such file or directory: "
        f"'{port}'): running without the modem, trying again every 0.2 s"
    ]
    assert monitor.status.power_cycles == 0
    assert emulator.commands[:3] == ["ATE0", "AT+CREG=1", "AT+CEREG=1"]  # set up once it opened
