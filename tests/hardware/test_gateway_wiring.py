"""The hardware inside the real gateway (``appliance.gateway.serve`` in this process, so the button's mock
pin can be pressed): a long press backs up and clears the databases, and the gateway exits with the
status systemd restarts on."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpiozero import Device
from gpiozero.pins.mock import MockFactory

from appliance.config import load_config
from appliance.gateway import serve
from appliance.hardware.factory_reset import FACTORY_RESET_EXIT_STATUS
from tests.systemd.notify_socket import NotifySocket

BUTTON, POWER = 23, 17


@pytest.fixture
def factory() -> Iterator[MockFactory]:
    mock = MockFactory()
    Device.pin_factory = mock
    yield mock
    mock.reset()
    Device.pin_factory = None


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
