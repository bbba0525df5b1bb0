"""A gateway whose database files lost their data refuses to start, names the file, and changes nothing.

SQLite opens a zero-length file as a new, empty database and serves a damaged page until a query happens
to touch it; both would turn lost or corrupt data into a gateway that runs as if nothing were wrong. Run
for real (``python -m appliance run``) against files made with the real stores.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.broker.persistence.store import DB_FILENAME, BrokerStore
from appliance.statestore.commands import SetCommand
from appliance.statestore.hlc import Hlc
from appliance.statestore.store import FILE_NAME, Quotas, StateStore

T0 = 1_700_000_000_000
PAGE = 4096


def run_gateway(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """Start the gateway on the folder; it must end by itself (refusing), well before the timeout."""
    return subprocess.run(
        [sys.executable, "-m", "appliance", "run", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60, check=False,
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def filled_state_store(data_dir: Path) -> Path:
    store = StateStore(data_dir, "gw", Quotas(100_000, 100_000_000))
    for n in range(400):
        store.set(SetCommand(b"key-%04d" % n, b"value " * 20), Hlc(T0 + n, 0, "client"), None, T0)
    store.close()  # the last connection checkpoints the WAL into the file
    return data_dir / FILE_NAME


@pytest.mark.parametrize("name", [FILE_NAME, DB_FILENAME])
def test_a_zero_length_database_stops_the_start_and_stays_as_it_is(tmp_path: Path, name: str) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    BrokerStore.open(data_dir / DB_FILENAME).close()
    filled_state_store(data_dir)
    (data_dir / name).write_bytes(b"")
    result = run_gateway(data_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{data_dir / name}: " in result.stdout and "empty file (0 bytes)" in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert (data_dir / name).stat().st_size == 0


def test_a_state_store_with_a_damaged_page_stops_the_start_naming_the_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    path = filled_state_store(data_dir)
    assert path.stat().st_size > 4 * PAGE
    with path.open("r+b") as file:  # a page of the entries' b-tree overwritten, as a bad sector does
        file.seek(2 * PAGE)
        file.write(b"\xa5" * PAGE)
    before = digest(path)
    result = run_gateway(data_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{path}: " in result.stdout and "state store database" in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert digest(path) == before


def test_a_healthy_state_store_still_starts_and_keeps_its_keys(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    filled_state_store(data_dir)
    store = StateStore(data_dir, "gw", Quotas(100_000, 100_000_000))
    try:
        entry = store.get(b"key-0399", T0)
        assert store.key_count == 400 and entry is not None and entry.value == b"value " * 20
    finally:
        store.close()
