"""``appliance passwd`` through the real command-line entry point, checked with mosquitto_passwd's files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from appliance.broker.security import passwd_cli
from appliance.broker.security.auth import Authenticator, read_password_file
from appliance.cli import main

ROOT = Path(__file__).resolve().parents[2]
FAST = ["-I", "1000"]


def check(path: Path, username: str, password: str) -> bool:
    return Authenticator.load(path, allow_anonymous=False).check(username, password)


def test_create_add_update_delete(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    assert main(["passwd", *FAST, "-c", "-b", str(path), "alice", "a-pw"]) == 0
    assert main(["passwd", *FAST, "-b", str(path), "bob", "b-pw"]) == 0
    assert check(path, "alice", "a-pw") and check(path, "bob", "b-pw")
    assert main(["passwd", *FAST, "-b", str(path), "alice", "new-pw"]) == 0
    assert check(path, "alice", "new-pw") and not check(path, "alice", "a-pw")
    assert main(["passwd", "-D", str(path), "bob"]) == 0
    assert set(read_password_file(path)) == {"alice"}
    assert main(["passwd", *FAST, "-c", "-b", str(path), "carol", "c-pw"]) == 0  # -c starts over
    assert set(read_password_file(path)) == {"carol"}


def test_prompts_twice_without_b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "passwd"
    answers = iter(["typed", "typed", "one", "other"])
    monkeypatch.setattr(passwd_cli.getpass, "getpass", lambda prompt: next(answers))
    assert main(["passwd", *FAST, "-c", str(path), "alice"]) == 0
    assert check(path, "alice", "typed")
    assert main(["passwd", *FAST, str(path), "alice"]) == 1  # mismatch: nothing changes
    assert check(path, "alice", "typed")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-b", "{file}", "alice", "pw"], "does not exist; use -c"),
        (["-c", "-b", "{file}", "al:ice", "pw"], "contains ':'"),
        (["-c", "{file}", "alice", "pw"], "with -b"),
        (["-D", "{existing}", "nobody"], "not found"),
        (["-b", "{broken}", "alice", "pw"], ":2: expected user:hash; the file was not changed"),
    ],
)
def test_refusals_leave_files_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    existing = tmp_path / "existing"
    main(["passwd", *FAST, "-c", "-b", str(existing), "alice", "pw"])
    broken = tmp_path / "broken"
    broken.write_text(existing.read_text() + "garbage line\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    names = {"file": tmp_path / "new", "existing": existing, "broken": broken}
    assert main(["passwd", *FAST, *(arg.format(**names) for arg in argv)]) == 1
    assert message in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_edits_a_file_made_by_mosquitto_passwd(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(path), "alice", "from-mosquitto"], check=True)
    subprocess.run(["mosquitto_passwd", "-H", "sha512", "-b", str(path), "old", "legacy"], check=True)
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "passwd", *FAST, "-b", str(path), "bob", "from-us"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert check(path, "alice", "from-mosquitto") and check(path, "old", "legacy") and check(path, "bob", "from-us")
    # mosquitto_passwd can still work on the file we rewrote.
    subprocess.run(["mosquitto_passwd", "-D", str(path), "alice"], check=True)
    assert set(read_password_file(path)) == {"old", "bob"}
