"""``appliance doctor`` checks against real sockets, directories, a pty modem and stand-in timedatectl scripts."""

from __future__ import annotations

import os
import socket
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from appliance.broker.config import ListenerConfig
from appliance.broker.persistence.store import BrokerStore, StoredMessage
from appliance.cli import main
from appliance.doctor import (
    Verdict,
    check_certificates,
    check_clock,
    check_data_dir,
    check_databases,
    check_disk,
    check_modem,
    check_ports,
)
from appliance.forwarding.queues import MessageStore
from appliance.hardware.config import ModemConfig
from testing.certificates import valid_for
from testing.processes import free_port
from tests.hardware.modem_emulator import ModemEmulator


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_ports_open_and_closed(listening: int) -> None:
    port = free_port()
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


@pytest.mark.parametrize(
    ("script", "verdict"),
    [
        ('[ "$*" = "show --property=NTPSynchronized --value" ] && echo yes\n', Verdict.OK),
        ("echo no\n", Verdict.PROBLEM),
        ("echo 'System has not been booted with systemd' >&2; exit 1\n", Verdict.UNKNOWN),
    ],
)
def test_clock_from_timedatectl(stand_in: Callable[[str, str], None], script: str, verdict: Verdict) -> None:
    stand_in("timedatectl", script)
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


def test_certificates_expired_near_expiry_unreadable_and_fine(tmp_path: Path) -> None:
    fine, fine_key = valid_for(tmp_path, "fine", 300)
    expired, expired_key = valid_for(tmp_path, "expired", -1)
    soon, _ = valid_for(tmp_path, "soon", 5)
    broken = tmp_path / "broken.pem"
    broken.write_text("not a certificate\n")
    listeners = [
        ListenerConfig("tcp", "127.0.0.1", 1883),
        ListenerConfig("tls", "0.0.0.0", 8883, certfile=fine, keyfile=fine_key, cafile=soon),
        ListenerConfig("websocket", "0.0.0.0", 8443, certfile=expired, keyfile=expired_key, cafile=broken),
    ]
    findings = {finding.message.split(":")[0]: finding for finding in check_certificates(listeners)}
    assert findings[f"TLS certfile {fine}"].verdict is Verdict.OK
    assert findings[f"TLS certfile {expired}"].verdict is Verdict.PROBLEM and "expired on" in findings[f"TLS certfile {expired}"].message
    assert findings[f"TLS cafile {soon}"].verdict is Verdict.PROBLEM and "renew it" in findings[f"TLS cafile {soon}"].message
    assert findings[f"TLS cafile {broken}"].verdict is Verdict.PROBLEM and "no PEM certificate" in findings[f"TLS cafile {broken}"].message
    assert check_certificates([ListenerConfig("tcp", "127.0.0.1", 1883)]) == []


PAGE = 4096


def gateway_databases(data_dir: Path) -> None:
    """The three databases as the real stores write them, each a few pages long."""
    data_dir.mkdir(exist_ok=True)
    broker = BrokerStore.open(data_dir / "broker.db")
    for n in range(300):
        message_id = broker.add_message(StoredMessage(f"t/{n}", b"payload " * 40, {}, None))
        broker.enqueue("client", message_id, 1)
    broker.commit()
    broker.close()
    forwarding = MessageStore(data_dir / "forwarding.db")
    forwarding.db.executescript("CREATE TABLE filler (n INTEGER PRIMARY KEY, text TEXT);"
                                "CREATE INDEX filler_text ON filler (text);")
    forwarding.db.executemany("INSERT INTO filler (text) VALUES (?)", [("x" * 100 + str(n),) for n in range(300)])
    forwarding.close()
    with sqlite3.connect(data_dir / "statestore.db") as statestore:
        statestore.execute("PRAGMA journal_mode=WAL")
        statestore.execute("CREATE TABLE entries (key BLOB PRIMARY KEY, value BLOB)")
        statestore.executemany("INSERT INTO entries VALUES (?, ?)", [(b"k%d" % n, b"v" * 100) for n in range(300)])
    statestore.close()


@pytest.mark.parametrize("name", ["broker.db", "statestore.db", "forwarding.db"])
def test_databases_integrity_check_names_the_damaged_file_and_changes_nothing(tmp_path: Path, name: str) -> None:
    data_dir = tmp_path / "data"
    gateway_databases(data_dir)
    findings = check_databases(data_dir)
    assert [f.verdict for f in findings] == [Verdict.OK] * 3, findings
    damaged = data_dir / name
    with damaged.open("r+b") as file:  # one page of a b-tree overwritten, as a bad sector does
        file.seek(2 * PAGE)
        file.write(b"\xa5" * PAGE)
    before = damaged.read_bytes()
    findings = check_databases(data_dir)
    [problem] = [f for f in findings if f.verdict is Verdict.PROBLEM]
    assert str(damaged) in problem.message and "is damaged" in problem.message, problem.message
    assert len(problem.message) < 1000  # the first problems, not thousands of lines
    assert sum(f.verdict is Verdict.OK for f in findings) == 2
    assert damaged.read_bytes() == before


def test_databases_an_index_that_disagrees_with_its_table(tmp_path: Path) -> None:
    """What only integrity_check sees (the start's quick_check does not compare indexes with tables)."""
    data_dir = tmp_path / "data"
    gateway_databases(data_dir)
    path = data_dir / "forwarding.db"
    # The index is hidden as a table while one row changes, so the row and its index entry disagree.
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA writable_schema = ON")
        db.execute("UPDATE sqlite_master SET sql = 'CREATE TABLE filler_text_gone (x)', type = 'table', "
                   "name = 'filler_text_gone', tbl_name = 'filler_text_gone' WHERE name = 'filler_text'")
    db.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE filler SET text = 'changed' WHERE n = 7")
        db.execute("PRAGMA writable_schema = ON")
        db.execute("UPDATE sqlite_master SET sql = 'CREATE INDEX filler_text ON filler (text)', type = 'index', "
                   "name = 'filler_text', tbl_name = 'filler' WHERE name = 'filler_text_gone'")
    db.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    db.close()
    [problem] = [f for f in check_databases(data_dir) if f.verdict is Verdict.PROBLEM]
    assert str(path) in problem.message and "filler_text" in problem.message, problem.message


@pytest.mark.parametrize("content", [b"not a database at all\n" * 300, os.urandom(8192), b"SQLite format 3\x00" + os.urandom(4080)],
                         ids=["text", "random", "header-then-garbage"])
def test_databases_a_file_that_is_no_database_is_a_problem_not_a_crash(tmp_path: Path, content: bytes) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "statestore.db").write_bytes(content)
    [problem] = check_databases(data_dir)
    assert problem.verdict is Verdict.PROBLEM and str(data_dir / "statestore.db") in problem.message
    assert (data_dir / "statestore.db").read_bytes() == content


def test_databases_a_zero_length_file_is_a_problem(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    gateway_databases(data_dir)
    (data_dir / "broker.db").write_bytes(b"")
    [problem] = [f for f in check_databases(data_dir) if f.verdict is Verdict.PROBLEM]
    assert "broker.db" in problem.message and "empty file" in problem.message


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
    tmp_path: Path, listening: int, capsys: pytest.CaptureFixture[str], stand_in: Callable[[str, str], None]
) -> None:
    stand_in("timedatectl", "echo yes\n")  # the host's own clock state is not under test
    port = free_port()
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o750)
    assert main(["doctor", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir)]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM" in out and f"127.0.0.1:{port}" in out and "1 problem(s) found" in out

    assert main(["doctor", "--listen", f"127.0.0.1:{listening}", "--data-dir", str(data_dir)]) == 0
    assert "no problems found" in capsys.readouterr().out
