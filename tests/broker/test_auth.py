"""Password hashing and the CONNECT credential policy, with mosquitto_passwd and mosquitto as real peers."""

from __future__ import annotations

import getpass
import subprocess
from pathlib import Path

import pytest

from appliance.broker.security.auth import (
    DEFAULT_ITERATIONS,
    Authenticator,
    PasswordFileError,
    PasswordHash,
    hash_password,
    parse_hash,
    parse_password_file,
    read_password_file,
    verify_password,
    write_password_file,
)
from testing.processes import MosquittoProcess

FAST = 1000  # iterations for tests that are not about the iteration count


def test_hash_round_trip_and_wrong_password() -> None:
    stored = hash_password("s3cret", iterations=FAST)
    assert stored.scheme == "7" and stored.iterations == FAST and len(stored.salt) == 12
    assert parse_hash(stored.encode()) == stored
    assert verify_password(stored, "s3cret") and verify_password(stored, b"s3cret")
    assert not verify_password(stored, "s3cret ")
    assert hash_password("s3cret", iterations=FAST).salt != stored.salt  # salted


def test_new_entries_use_the_strong_default() -> None:
    assert hash_password("x").encode().startswith(f"$7${DEFAULT_ITERATIONS}$")
    assert DEFAULT_ITERATIONS >= 100_000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice\n", ":1: expected user:hash"),
        ("# comment\n\nalice:plaintext\n", ":3: user 'alice': not a $7$"),
        ("alice:$7$abc$c2FsdA==$aGFzaA==\n", ":1: user 'alice': bad password hash"),
        ("alice:$7$10$not base64!$aGFzaA==\n", ":1: user 'alice': bad password hash"),
        ("alice:$6$$aGFzaA==\n", ":1: user 'alice': bad password hash"),
        ("alice:$7$10$c2FsdA==$aGFzaA==\nalice:$7$10$c2FsdA==$aGFzaA==\n", ":2: user 'alice' appears twice"),
    ],
)
def test_bad_password_files_name_the_line(text: str, message: str) -> None:
    with pytest.raises(PasswordFileError) as caught:
        parse_password_file(text, "pw.txt")
    assert str(caught.value).startswith("pw.txt:") and message in str(caught.value)


def test_missing_file_is_a_password_file_error(tmp_path: Path) -> None:
    with pytest.raises(PasswordFileError, match="cannot read"):
        Authenticator.load(tmp_path / "absent", allow_anonymous=False)


def test_write_is_atomic_owner_only_and_rereadable(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    entries = {"alice": hash_password("a", iterations=FAST), "bob": hash_password("b", iterations=FAST)}
    write_password_file(path, entries)
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_password_file(path) == entries
    assert [p.name for p in tmp_path.iterdir()] == ["passwd"]  # no temporary file left behind
    with pytest.raises(ValueError, match="cannot be stored"):
        write_password_file(path, {"a:b": entries["alice"]})
    assert read_password_file(path) == entries


@pytest.mark.parametrize(
    ("allow_anonymous", "username", "password", "expected"),
    [
        (True, None, None, True),
        (False, None, None, False),
        (False, "alice", "right", True),
        (True, "alice", "right", True),
        (True, "alice", "wrong", False),
        (True, "alice", None, False),
        (True, "mallory", "right", False),  # with a password file, unknown names are refused
    ],
)
def test_policy_with_a_password_file(allow_anonymous: bool, username: str | None, password: str | None, expected: bool) -> None:
    authenticator = Authenticator({"alice": hash_password("right", iterations=FAST)}, allow_anonymous)
    assert authenticator.check(username, password) is expected


@pytest.mark.parametrize("allow_anonymous", [True, False])
def test_policy_without_a_password_file(allow_anonymous: bool) -> None:
    authenticator = Authenticator(None, allow_anonymous)
    assert authenticator.check("anyone", "anything") is allow_anonymous
    assert authenticator.check(None, None) is allow_anonymous
    assert authenticator.check_cached("anyone", "anything") is allow_anonymous


def test_cached_verdicts_skip_hashing_only_for_a_proven_password() -> None:
    authenticator = Authenticator({"alice": hash_password("right", iterations=FAST)}, allow_anonymous=False)
    assert authenticator.check_cached(None, None) is False
    assert authenticator.check_cached("alice", "right") is None  # needs PBKDF2: run check in an executor
    assert authenticator.check("alice", "right")
    assert authenticator.check_cached("alice", "right") is True
    assert authenticator.check_cached("alice", "wrong") is None
    assert not authenticator.check("alice", "wrong")
    reloaded = Authenticator({"alice": hash_password("new", iterations=FAST)}, allow_anonymous=False)
    assert reloaded.check_cached("alice", "right") is None and not reloaded.check("alice", "right")


def test_entries_made_by_mosquitto_passwd_verify(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(path), "alice", "pbkdf2 pass"], check=True)
    subprocess.run(["mosquitto_passwd", "-H", "sha512", "-b", str(path), "bob", "sha512-pass"], check=True)
    authenticator = Authenticator.load(path, allow_anonymous=False)
    assert authenticator.usernames == {"alice", "bob"}
    entries = read_password_file(path)
    assert entries["alice"].scheme == "7" and entries["bob"].scheme == "6"
    assert authenticator.check("alice", "pbkdf2 pass") and not authenticator.check("alice", "pbkdf2 pas")
    assert authenticator.check("bob", "sha512-pass") and not authenticator.check("bob", "sha512-pas")


def test_mosquitto_accepts_our_password_file(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    write_password_file(
        path,
        {"alice": hash_password("alice-pw"), "bob": hash_password("bob-pw", iterations=FAST)},
    )
    # As root, mosquitto would switch to the "mosquitto" user, which cannot read a file under tmp_path.
    config = f"allow_anonymous false\npassword_file {path}\nuser {getpass.getuser()}\n"
    with MosquittoProcess(tmp_path / "mosquitto", extra_config=config) as broker:

        def publish(*credentials: str) -> int:
            command = ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-t", "t", "-m", "m", *credentials]
            return subprocess.run(command, capture_output=True, timeout=20).returncode

        assert publish("-u", "alice", "-P", "alice-pw") == 0  # the strong default iteration count
        assert publish("-u", "bob", "-P", "bob-pw") == 0
        assert publish("-u", "alice", "-P", "bob-pw") != 0
        assert publish() != 0  # anonymous refused, as configured


def test_password_hash_encoding_matches_mosquitto_layout() -> None:
    stored = PasswordHash("7", 101, b"\x01" * 12, b"\x02" * 64)
    iterations, salt, digest = stored.encode().split("$")[2:]
    assert iterations == "101" and len(salt) == 16 and len(digest) == 88
    six = PasswordHash("6", 0, b"\x01" * 12, b"\x02" * 64)
    assert six.encode().count("$") == 3 and parse_hash(six.encode()) == six
