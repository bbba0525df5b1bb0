"""Every file the gateway cannot use at start is a ``StartupError`` naming the file (and the line), made
by the real readers from real bad files; ``appliance run`` catches the base class once (``gateway.py``)."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path

import pytest

from appliance.broker.config import ListenerConfig
from appliance.broker.persistence.store import BrokerStore, CorruptDatabaseError, PersistenceError
from appliance.broker.security.acl import Acl, AclFileError
from appliance.broker.security.auth import PasswordFileError, read_password_file
from appliance.broker.transport.certificates import CertificateFileError, date_problems
from appliance.broker.transport.server import TlsSetupError, tls_context
from appliance.sqlite_files import DatabaseFileError, refuse_emptied
from appliance.startup_error import StartupError

ROOT = Path(__file__).resolve().parents[1]


def test_an_emptied_database_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"")
    with pytest.raises(DatabaseFileError) as caught:
        refuse_emptied(path, "state store database")
    error = caught.value
    assert isinstance(error, StartupError)
    assert (error.path, error.line) == (str(path), None)
    assert str(error) == f"{path}: {error.why}" and "empty file (0 bytes)" in error.why


def test_a_broker_database_that_is_not_one_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    path.write_bytes(b"not a database" * 512)
    with pytest.raises(CorruptDatabaseError) as caught:
        BrokerStore.open(path)
    error = caught.value
    assert isinstance(error, PersistenceError) and isinstance(error, StartupError)
    assert error.path == str(path) and str(error) == f"{path}: {error.why}" and not error.disk_full


def test_a_bad_password_line_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text("# users\nalice\n")
    with pytest.raises(PasswordFileError) as caught:
        read_password_file(path)
    error = caught.value
    assert isinstance(error, StartupError) and isinstance(error, ValueError)
    assert (error.path, error.line, error.why) == (str(path), 2, "expected user:hash")
    assert str(error) == f"{path}:2: expected user:hash"


def test_a_bad_acl_line_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    path.write_text("topic read a/#\nuser\n")
    with pytest.raises(AclFileError) as caught:
        Acl.load(path)
    error = caught.value
    assert isinstance(error, StartupError) and isinstance(error, ValueError)
    assert (error.path, error.line) == (str(path), 2)
    assert str(error) == f"{path}:2: 'user' needs a user name"


def test_a_missing_tls_file_names_its_role_and_path(tmp_path: Path) -> None:
    certfile = tmp_path / "missing.pem"
    with pytest.raises(TlsSetupError) as caught:
        tls_context(ListenerConfig(type="tls", certfile=certfile, keyfile=certfile))
    error = caught.value
    assert isinstance(error, StartupError)
    assert (error.role, error.path) == ("certfile", str(certfile))
    assert str(error) == f"TLS certfile {certfile}: {error.why}" and "No such file" in error.why


def test_a_tls_file_whose_dates_cannot_be_read_names_its_role_and_path(tmp_path: Path) -> None:
    cafile = tmp_path / "ca.pem"
    cafile.write_text("not a certificate\n")
    with pytest.raises(CertificateFileError) as caught:
        date_problems(cafile, "cafile", datetime.now(UTC))
    error = caught.value
    assert isinstance(error, StartupError)
    assert (error.role, error.path) == ("cafile", str(cafile))
    assert str(error) == f"TLS cafile {cafile}: {error.why}" and "no PEM certificate" in error.why


def startup_error_subclasses() -> set[str]:
    """Every class of ``appliance/`` that derives from ``StartupError``, directly or not (by name, read
    from the source: a new one is found without being listed here)."""
    bases: dict[str, set[str]] = {}
    for path in (ROOT / "appliance").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {base.id for base in node.bases if isinstance(base, ast.Name)}
    found = {"StartupError"}
    while True:
        more = {name for name, parents in bases.items() if parents & found} - found
        if not more:
            return found - {"StartupError"}
        found |= more


def test_the_gateway_catches_startup_errors_by_their_base_class_only() -> None:
    """A new kind of file error needs no new ``except`` in ``gateway.py``: it names none of the subclasses."""
    tree = ast.parse((ROOT / "appliance/gateway.py").read_text())
    caught = {
        name.id
        for handler in ast.walk(tree)
        if isinstance(handler, ast.ExceptHandler) and handler.type is not None
        for name in ast.walk(handler.type)
        if isinstance(name, ast.Name)
    }
    subclasses = startup_error_subclasses()
    assert {"PersistenceError", "DatabaseFileError", "TlsSetupError", "PasswordFileError", "AclFileError",
            "CertificateFileError"} <= subclasses
    assert "StartupError" in caught and not caught & subclasses
