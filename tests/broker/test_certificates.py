"""Certificate validity dates read with ``cryptography`` (issue 12 item 11), on certificates made by the
test with chosen dates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.transport.certificates import (
    NEAR_EXPIRY,
    CertificateFileError,
    date_problems,
)
from testing.campaigns import campaign
from testing.certificates import valid_for, write_certificate

NOW = datetime.now(UTC)
REAL_PEM: list[bytes] = []


def test_a_certificate_with_months_left_is_fine(tmp_path: Path) -> None:
    cert, _ = valid_for(tmp_path, "fine", 200)
    assert date_problems(cert, "certfile", NOW) == []


def test_an_expired_certificate_is_named_with_its_file_and_date(tmp_path: Path) -> None:
    cert, _ = valid_for(tmp_path, "old", -3, common_name="gateway.example")
    now = datetime.now(UTC)  # after the certificate was made: exactly 3 days and a little
    [problem] = date_problems(cert, "certfile", now)
    expiry = (now - timedelta(days=3)).strftime("%Y-%m-%d")
    assert problem.invalid_now and str(cert) in str(problem) and "CN=gateway.example" in str(problem)
    assert f"expired on {expiry}" in str(problem) and "3 days ago" in str(problem)


def test_a_certificate_near_its_expiry_is_a_warning_with_the_days_left(tmp_path: Path) -> None:
    cert, _ = valid_for(tmp_path, "soon", 12.5)
    [problem] = date_problems(cert, "certfile", NOW)
    assert not problem.invalid_now and "(in 12 days); renew it" in str(problem) and str(cert) in str(problem)
    assert date_problems(cert, "certfile", NOW, near=timedelta(days=10)) == []
    assert timedelta(days=30) == NEAR_EXPIRY


def test_a_certificate_not_valid_yet_points_at_the_clock(tmp_path: Path) -> None:
    cert, _ = write_certificate(tmp_path, "future", NOW + timedelta(days=2), NOW + timedelta(days=400))
    [problem] = date_problems(cert, "certfile", NOW)
    assert problem.invalid_now and "not valid before" in str(problem) and "clock" in str(problem)


def test_every_certificate_of_a_chain_or_bundle_is_checked(tmp_path: Path) -> None:
    leaf, key = valid_for(tmp_path, "leaf", 300)
    intermediate, _ = valid_for(tmp_path, "intermediate", -1, common_name="Old Intermediate")
    chain = tmp_path / "chain.pem"
    chain.write_bytes(leaf.read_bytes() + key.read_bytes() + intermediate.read_bytes())  # a key in it is skipped
    [problem] = date_problems(chain, "cafile", NOW)
    assert "CN=Old Intermediate" in str(problem) and str(problem).startswith(f"TLS cafile {chain}: ")


@pytest.mark.parametrize("content", [b"", b"not a certificate\n", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"])
def test_a_file_without_a_readable_certificate_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.pem"
    path.write_bytes(content)
    with pytest.raises(CertificateFileError, match=f"TLS certfile {path}: no PEM certificate"):
        date_problems(path, "certfile", NOW)
    with pytest.raises(CertificateFileError, match="No such file"):
        date_problems(tmp_path / "missing.pem", "certfile", NOW)


@campaign(200, deadline=None)
@given(st.binary(max_size=2000), st.sampled_from([b"", b"-----BEGIN CERTIFICATE-----\n", b"-----END CERTIFICATE-----\n"]))
def test_hostile_certificate_files_give_an_error_never_a_crash(tmp_path_factory: pytest.TempPathFactory,
                                                             junk: bytes, marker: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "cert.pem"
    path.write_bytes(marker + junk + marker)
    try:
        assert isinstance(date_problems(path, "certfile", NOW), list)
    except CertificateFileError as exc:
        assert str(path) in str(exc)


@campaign(300, deadline=None)
@given(st.data())
def test_a_damaged_real_certificate_gives_an_error_or_its_dates_never_a_crash(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    directory = tmp_path_factory.mktemp("damaged")
    if not REAL_PEM:  # one certificate for every example: its length must not change between them
        REAL_PEM.append(valid_for(directory, "real", -5)[0].read_bytes())
    cert = directory / "real.pem"
    pem = bytearray(REAL_PEM[0])
    for _ in range(data.draw(st.integers(1, 8))):
        pem[data.draw(st.integers(0, len(pem) - 1))] = data.draw(st.integers(0, 255))
    cert.write_bytes(bytes(pem))
    try:
        problems = date_problems(cert, "certfile", NOW)
    except CertificateFileError as exc:
        assert str(cert) in str(exc)
    else:
        assert all(str(cert) in str(problem) for problem in problems)
