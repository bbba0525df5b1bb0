"""The real gateway process under a stand-in systemd: READY=1 only once clients can connect, watchdog pings
at WATCHDOG_USEC/2 from its loop, STOPPING=1 on SIGTERM. And the hardware wired in: with
``GPIOZERO_PIN_FACTORY=mock`` and the modem emulator on a pty, the modem's readings reach MQTT clients as
retained ``$SYS/gateway/modem/...`` messages."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

from testing import run_queue
from testing.collector import Collector
from testing.processes import GatewayProcess
from tests.hardware.modem_emulator import ModemEmulator
from tests.systemd.notify_socket import NotifySocket


def test_ready_watchdog_and_stopping_from_the_running_gateway(tmp_path: Path) -> None:
    receiver = NotifySocket(str(tmp_path / "notify"))
    interval = 0.2  # WATCHDOG_USEC / 2
    gateway = GatewayProcess(tmp_path / "data", env={"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "400000"})
    try:
        gateway.start()
        [(_, ready)] = receiver.wait_for(1)[:1]
        assert ready.startswith("READY=1\nSTATUS=listening on tcp://127.0.0.1:")
        with socket.create_connection((gateway.host, gateway.port), timeout=5):
            pass  # READY=1 came after the listener accepts
        assert gateway.process is not None
        with run_queue.sampling(gateway.process.pid) as cpu_wait:  # its main thread runs the loop
            messages = receiver.wait_for(len(receiver.messages) + 8, timeout=20)
        pings = [at for at, message in messages if message == "WATCHDOG=1" and at >= cpu_wait.stamps[0]]
        assert len(pings) >= 6
        # Every half period, not every period, in every gap: the stamps are the kernel's (when each ping was
        # sent), and the time the gateway's loop thread spent waiting for a CPU in a gap is the machine's
        # load, not the loop's: what is left is the loop's own delay, which half an interval of margin
        # still tells from a whole period (a loop blocked by its own work for that long would fail here).
        # The mean over the span rules out a storm of pings.
        gaps = [(later - earlier, cpu_wait.between(earlier, later)) for earlier, later in itertools.pairwise(pings)]
        assert all(gap - waited <= interval + interval / 2 for gap, waited in gaps), gaps
        assert (pings[-1] - pings[0]) / len(gaps) >= interval / 2, gaps
        assert gateway.terminate() == 0
        assert receiver.messages[-1][1] == "STOPPING=1"
    finally:
        gateway.kill9()
        receiver.close()


def test_gateway_publishes_modem_readings_with_hardware_enabled(tmp_path: Path) -> None:
    emulator = ModemEmulator().start()
    config = tmp_path / "gateway.toml"
    config.write_text(
        "[hardware.gpio]\nenabled = true\npower_led = 17\nuplink_led = 27\nmodem_relay = 24\n"
        f'[hardware.modem]\nenabled = true\nport = "{emulator.port}"\ncommand_timeout = 1.0\npoll_interval = 0.3\n'
    )
    gateway = GatewayProcess(tmp_path / "data", config=config, env={"GPIOZERO_PIN_FACTORY": "mock"})
    modem_topics = {"$SYS/gateway/modem/operator", "$SYS/gateway/modem/technology"}
    collector = None
    try:
        gateway.start()
        collector = Collector(gateway.host, gateway.port, "$SYS/gateway/modem/#")

        def latest() -> dict[str, bytes]:
            return {m.topic: m.payload for m in collector.snapshot() if m.payload}

        collector.wait_until(lambda: modem_topics <= latest().keys(), 10, gateway.output)
        assert latest()["$SYS/gateway/modem/operator"] == b"Emu Mobile"
        assert latest()["$SYS/gateway/modem/technology"] == b"LTE"
        assert "AT+CSQ" in emulator.commands
        assert gateway.terminate() == 0
    finally:
        if collector is not None:
            collector.close()
        gateway.kill9()
        emulator.close()
