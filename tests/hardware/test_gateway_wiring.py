"""The hardware inside the real gateway (``appliance.gateway.serve`` in this process, so the mock pins can
be pressed and read): a long press backs up and clears the databases, and the gateway exits with the
status systemd restarts on; the modem's link state gates the forwarding bridge, and the uplink and backlog
LEDs follow the bridge and the queues."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sqlite3
import statistics
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from gpiozero.pins.mock import MockFactory, MockPin

from appliance.gateway import serve
from appliance.gateway_config import load_config
from appliance.hardware.factory_reset import FACTORY_RESET_EXIT_STATUS
from appliance.hardware.gpio import FAST_BLINK, SLOW_BLINK
from hil_tests.rig.relay import RelayThread
from testing import timer_lateness, waiting
from testing.collector import Collector
from testing.device import Device as PeerDevice
from testing.processes import MosquittoProcess
from tests.forwarding.rig import manifest
from tests.hardware.modem_emulator import ModemEmulator
from tests.systemd.notify_socket import NotifySocket

BUTTON, POWER = 23, 17


def test_long_press_in_the_running_gateway_resets_and_exits_for_a_restart(
    tmp_path: Path, factory: MockFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with sqlite3.connect(data / "forwarding.db") as db:
        db.execute("CREATE TABLE queue (id INTEGER PRIMARY KEY, body BLOB)")
        db.execute("INSERT INTO queue (body) VALUES (x'01')")
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        f'[gateway]\ndata_dir = "{data}"\n[[broker.listeners]]\nhost = "127.0.0.1"\nport = 0\n'
        f"[hardware.gpio]\nenabled = true\npower_led = {POWER}\nbutton = {BUTTON}\nlong_press_seconds = 0.2\n"
    )
    receiver = NotifySocket(str(tmp_path / "notify"))
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))

    async def press_after_ready() -> int:
        gateway = asyncio.create_task(serve(load_config(config_file)))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, receiver.wait_for, 1)  # READY=1
        assert factory.pin(POWER).state is True  # steady: show_ready() was called
        factory.pin(BUTTON).drive_low()
        return await asyncio.wait_for(gateway, 10)

    try:
        assert asyncio.run(press_after_ready()) == FACTORY_RESET_EXIT_STATUS
    finally:
        receiver.close()
    with sqlite3.connect(data / "forwarding.db") as db:
        assert db.execute("SELECT count(*) FROM queue").fetchone() == (0,)
    [backup] = (data / "backups").glob("factory-reset-*.tar.gz")
    assert backup.stat().st_size > 0
    assert [message for _, message in receiver.messages][-1] == "STOPPING=1"


def test_short_press_in_the_running_gateway_logs_the_broker_status(
    tmp_path: Path, factory: MockFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The short press's status line carries the broker's own numbers, not just the modem's."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    caplog.set_level(logging.INFO, logger="appliance")
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        f'[gateway]\ndata_dir = "{tmp_path / "data"}"\n[[broker.listeners]]\nhost = "127.0.0.1"\nport = 0\n'
        f"[hardware.gpio]\nenabled = true\nbutton = {BUTTON}\nlong_press_seconds = 5\n"
    )

    async def press_and_stop() -> int:
        gateway = asyncio.create_task(serve(load_config(config_file)))
        await until(lambda: "appliance ready" in caplog.text)
        factory.pin(BUTTON).drive_low()
        factory.pin(BUTTON).drive_high()
        await until(lambda: "status: clients=0" in caplog.text)
        os.kill(os.getpid(), signal.SIGTERM)  # serve's own handler: the normal shutdown path
        return await asyncio.wait_for(gateway, 10)

    assert asyncio.run(press_and_stop()) == 0


UPLINK, BACKLOG = 27, 22


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """A whole gateway starts in these tests: a longer default deadline."""
    await waiting.until(condition, timeout, "gateway condition")



# The backlog LED's slow and fast blink (seconds on = seconds off), and the halfway mark between them.
SLOW_BLINK_S = SLOW_BLINK[0]
FAST_BLINK_S = FAST_BLINK[0]
HALFWAY_BLINK_S = (SLOW_BLINK_S + FAST_BLINK_S) / 2
# A backoff floor far longer than a reconnect takes on a loaded machine, so a reconnect woken by the link
# is told from one after the backoff.
BACKOFF_MIN_S = 30


def blink_period(pin: MockPin, changes: int = 6, timeout: float = 30.0) -> float:
    """The median time between the pin's next ``changes`` state changes (the LED must be blinking; run
    from a worker thread while the gateway's loop blinks it: the pin's history is all there is to watch)."""
    pin.clear_states()
    waiting.wait_until(lambda: len(pin.states) > changes, timeout, lambda: f"pin not blinking: {pin.states}")
    return statistics.median(state.timestamp for state in pin.states[2:])


def fast_blink_period(pin: MockPin) -> tuple[float, float]:
    """`blink_period` and the typical lateness of a 0.1 s timer on this machine meanwhile."""
    with timer_lateness.probing(FAST_BLINK_S) as lateness:
        period = blink_period(pin)
    return period, lateness.median()


def test_modem_link_gates_the_bridge_and_the_leds_follow_bridge_and_backlog(
    tmp_path: Path, factory: MockFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Registration lost -> the bridge disconnects and makes no attempt at all (the relay, standing in for
    the cellular network, is down too, so every attempt would be counted there); devices' messages wait,
    the backlog LED blinks slow then fast. Registration back -> one connection at once (the backoff
    floor is skipped), the backlog drains, the LEDs go to "connected" and "empty"."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    caplog.set_level(logging.INFO, logger="appliance")
    emulator = ModemEmulator().start()
    cloud_broker = MosquittoProcess(tmp_path / "cloud").start()
    relay = RelayThread(cloud_broker.host, cloud_broker.port)
    relay.start()
    (tmp_path / "manifest.json").write_text(manifest({"all": "FROM /messages/* INTO $upstream"}))
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        f'[gateway]\nid = "gw1"\ndata_dir = "{tmp_path / "data"}"\nmetrics_port = 0\n'
        '[[broker.listeners]]\nhost = "127.0.0.1"\nport = 0\n'
        f"[hardware.gpio]\nenabled = true\nuplink_led = {UPLINK}\nbacklog_led = {BACKLOG}\n"
        "backlog_slow_from = 1\nbacklog_fast_from = 5\n"
        f'[hardware.modem]\nenabled = true\nport = "{emulator.port}"\ncommand_timeout = 0.5\npoll_interval = 0.2\n'
        '[forwarding]\nenabled = true\nmanifest = "manifest.json"\n'
        f'[forwarding.upstream]\nhost = "127.0.0.1"\nport = {relay.port}\nkeepalive_s = 5\n'
        f"backoff_min_s = {BACKOFF_MIN_S}\nbackoff_max_s = {2 * BACKOFF_MIN_S}\n"
    )
    uplink, backlog = factory.pin(UPLINK), factory.pin(BACKLOG)

    def attempts() -> int:
        stats = relay.stats()
        return stats.connections_total + stats.connections_refused

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        gateway = asyncio.create_task(serve(load_config(config_file)))
        cloud = device = None
        try:
            await until(lambda: "appliance ready" in caplog.text)
            port = int(re.search(r"tcp://127\.0\.0\.1:(\d+)", caplog.text).group(1))  # type: ignore[union-attr]
            await until(lambda: uplink.state is True)  # modem registered, then the bridge connected
            assert attempts() == 1
            cloud = await loop.run_in_executor(None, Collector, cloud_broker.host, cloud_broker.port, "gateways/#")
            device = await loop.run_in_executor(None, PeerDevice, "127.0.0.1", port, "t1")

            emulator.creg = emulator.cereg = 0
            emulator.send_urc("+CREG: 0")
            emulator.send_urc("+CEREG: 0")
            await until(lambda: uplink.state is False)  # the bridge let go of its connection
            relay.set(up=False)  # the cellular network is gone as well
            relay.cut()
            before = attempts()
            for n in range(6):
                assert await loop.run_in_executor(None, device.publish, "data", b"x", {"n": str(n)}) == 0
                if n == 2:
                    assert await loop.run_in_executor(None, blink_period, backlog) > HALFWAY_BLINK_S  # slow (timers are never early)
            # Fast, not slow: below halfway between them plus how late a timer of the fast blink's length
            # wakes up on this machine right now (each blink is such a timer).
            fast, lateness = await loop.run_in_executor(None, fast_blink_period, backlog)
            assert fast < HALFWAY_BLINK_S + lateness, (fast, lateness)
            polls = emulator.commands.count("AT+CSQ")
            await until(lambda: emulator.commands.count("AT+CSQ") >= polls + 5)  # >= 1 s of polling while down
            assert attempts() == before and cloud.messages == []  # no attempt, nothing sent

            relay.set(up=True)
            emulator.creg = emulator.cereg = 1
            back_at = loop.time()
            emulator.send_urc("+CEREG: 1")
            await until(lambda: uplink.state is True)
            assert loop.time() - back_at < BACKOFF_MIN_S  # woken by the link, not after the backoff floor
            received = await loop.run_in_executor(None, cloud.wait_for, 6)
            assert sorted(r.n for r in received) == list(range(6))
            # One attempt per link-up: a poll the emulator answered just before its registration changed
            # can flap the link once more (up, down, up), which is a second, legitimate attempt.
            assert before + 1 <= attempts() <= before + 2
            metrics_url = re.search(r"metrics on (http://\S+)", caplog.text).group(1)  # type: ignore[union-attr]
            metrics = await loop.run_in_executor(None, lambda: urllib.request.urlopen(metrics_url, timeout=5).read().decode())
            assert "appliance_modem_registered 1\n" in metrics and 'appliance_link_connected{endpoint="upstream"} 1' in metrics
            await until(lambda: backlog.state is False)
            backlog.clear_states()
            polls = emulator.commands.count("AT+CSQ")
            await until(lambda: emulator.commands.count("AT+CSQ") >= polls + 4)  # longer than a slow blink
            assert len(backlog.states) == 1  # off for good, not between two blinks
        finally:
            if device is not None:
                device.close()
            if cloud is not None:
                cloud.close()
            if not gateway.done():
                os.kill(os.getpid(), signal.SIGTERM)  # serve's own handler: the normal shutdown path
            assert await asyncio.wait_for(gateway, 20) == 0

    try:
        asyncio.run(scenario())
    finally:
        relay.stop()
        cloud_broker.stop()
        emulator.close()
    # The bridge's disconnect at shutdown still reaches the uplink LED: the panel closes after it.
    failures = [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
    assert failures == [], [record.getMessage() for record in failures]
