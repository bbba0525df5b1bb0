"""``appliance doctor`` checks against real sockets, directories, a pty modem and stand-in timedatectl scripts."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.broker.config import ListenerConfig
from appliance.cli import main
from appliance.doctor import Verdict, check_clock, check_data_dir, check_disk, check_modem, check_ports
from appliance.hardware.config import ModemConfig
from tests.hardware.modem_emulator import ModemEmulator


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ports_open_and_closed(listening: int) -> None:
    port = closed_port()
    up, down = check_ports([ListenerConfig("tcp", "0.0.0.0", listening), ListenerConfig("tcp", "127.0.0.1", port)])
    assert up.verdict is Verdict.OK
    assert down.verdict is Verdict.PROBLEM and f"127.0.0.1:{port}" in down.message and "gateway running" in down.message


def test_data_dir_fine_missing_and_world_writable(tmp_path: Path) -> None:
    [fine] = check_data_dir(tmp_path)
    assert fine.verdict is Verdict.OK
    [missing] = check_data_dir(tmp_path / "nope")
    assert missing.verdict is Verdict.PROBLEM and "does not exist" in missing.message
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    [loose] = check_data_dir(open_dir)
    assert loose.verdict is Verdict.PROBLEM and "every user" in loose.message


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anything, so a read-only file is not a problem for root")
def test_data_dir_with_a_database_this_user_cannot_write(tmp_path: Path) -> None:
    database = tmp_path / "broker.db"
    database.write_bytes(b"")
    database.chmod(0o400)
    [finding] = check_data_dir(tmp_path)
    assert finding.verdict is Verdict.PROBLEM and "broker.db" in finding.message


def fake_timedatectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "timedatectl"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(
    ("script", "verdict"),
    [
        ('[ "$*" = "show --property=NTPSynchronized --value" ] && echo yes\n', Verdict.OK),
        ("echo no\n", Verdict.PROBLEM),
        ("echo 'System has not been booted with systemd' >&2; exit 1\n", Verdict.UNKNOWN),
    ],
)
def test_clock_from_timedatectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, verdict: Verdict) -> None:
    fake_timedatectl(tmp_path, monkeypatch, script)
    finding = check_clock()
    assert finding.verdict is verdict, finding.message
    if verdict is Verdict.PROBLEM:
        assert "within a minute" in finding.message


def test_clock_without_timedatectl_is_unknown_not_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert check_clock().verdict is Verdict.UNKNOWN


def test_disk_space(tmp_path: Path) -> None:
    assert check_disk(tmp_path / "not-yet", min_free_bytes=0, min_free_fraction=0).verdict is Verdict.OK
    low = check_disk(tmp_path, min_free_bytes=1 << 60)
    assert low.verdict is Verdict.PROBLEM and "MB free" in low.message


def test_modem_checks(tmp_path: Path) -> None:
    assert check_modem(ModemConfig(), probe=True)[0].message == "no modem configured"
    [missing] = check_modem(ModemConfig(enabled=True, port=str(tmp_path / "ttyUSB9")), probe=False)
    assert missing.verdict is Verdict.PROBLEM and "plugged in" in missing.message
    emulator = ModemEmulator().start()
    try:
        config = ModemConfig(enabled=True, port=emulator.port, command_timeout=0.3)
        [present] = check_modem(config, probe=False)
        assert present.verdict is Verdict.OK and emulator.commands == []  # not probed: the gateway owns the port
        [registered] = check_modem(config, probe=True)
        assert registered.verdict is Verdict.OK and "Emu Mobile" in registered.message
        emulator.creg = emulator.cereg = 3
        [denied] = check_modem(config, probe=True)
        assert denied.verdict is Verdict.PROBLEM and "not registered" in denied.message and "denied" in denied.message
        emulator.hung = True
        [hung] = check_modem(config, probe=True)
        assert hung.verdict is Verdict.PROBLEM and "does not answer" in hung.message
    finally:
        emulator.close()


def test_cli_exits_non_zero_and_says_why(
    tmp_path: Path, listening: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_timedatectl(tmp_path, monkeypatch, "echo yes\n")  # the host's own clock state is not under test
    port = closed_port()
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o750)
    assert main(["doctor", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir)]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM" in out and f"127.0.0.1:{port}" in out and "1 problem(s) found" in out

    assert main(["doctor", "--listen", f"127.0.0.1:{listening}", "--data-dir", str(data_dir)]) == 0
    assert "no problems found" in capsys.readouterr().out
