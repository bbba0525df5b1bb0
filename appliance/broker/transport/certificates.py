"""Validity dates of the TLS certificates a listener serves or trusts, read before anyone connects.

OpenSSL loads an expired certificate without a word, and the first sign is every client failing its
handshake - on a gateway in a field, when nobody is looking. So at start (``server.tls_context``) and in
``appliance doctor`` every certificate in a listener's ``certfile`` (the server certificate and its
chain) and ``cafile`` is decoded with ``cryptography`` and reported when it is expired, not valid yet,
or expires within ``NEAR_EXPIRY``: the file, the certificate's subject and the date.

An expired server certificate is a warning, not a refusal to start (mosquitto loads it too): the
gateway serves plain TCP, the state store and forwarding next to TLS, and a Pi without a real-time
clock that boots before NTP has set the time would otherwise refuse to start over a clock that is
wrong, not a certificate; clients that check dates refuse the certificate themselves.

``cryptography`` is imported when a file is read, not with this module: loading it costs the process
about 11 MB of resident memory for good, which a gateway without a TLS listener does not pay.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from appliance.startup_error import StartupError

#: A certificate that expires sooner than this is reported: time to renew it.
NEAR_EXPIRY = timedelta(days=30)


class CertificateFileError(StartupError):
    """A TLS file (``role``) holds no certificate whose dates can be read; the message names the file."""

    def __init__(self, role: str, path: str | Path, why: str) -> None:
        self.role = role
        super().__init__(path, why)

    @property
    def location(self) -> str:
        return f"TLS {self.role} {self.path}"


@dataclass(frozen=True, slots=True)
class DateProblem:
    """One certificate of ``path`` whose dates need attention; ``invalid_now``: expired or not valid yet
    (clients refuse it today), rather than only near its expiry."""

    path: Path
    role: str
    subject: str
    message: str
    invalid_now: bool

    def __str__(self) -> str:
        return f"TLS {self.role} {self.path}: certificate {self.subject} {self.message}"


def _day(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def date_problems(path: Path, role: str, now: datetime, near: timedelta = NEAR_EXPIRY) -> list[DateProblem]:
    """The certificates in the PEM file ``path`` that are expired, not yet valid, or expire within
    ``near`` of ``now`` (an aware UTC datetime). Raises ``CertificateFileError`` for a file without a
    readable certificate."""
    from cryptography import x509

    try:
        certificates = x509.load_pem_x509_certificates(Path(path).read_bytes())
        # cryptography parses a certificate's fields when they are read: a damaged subject or date raises
        # here, not at the load, so they are read inside the try.
        fields = [(certificate.subject.rfc4514_string() or "(no subject)", certificate.not_valid_before_utc,
                   certificate.not_valid_after_utc) for certificate in certificates]
    except OSError as exc:
        raise CertificateFileError(role, path, str(exc.strerror or exc)) from None
    except (ValueError, x509.InvalidVersion) as exc:  # a damaged version field raises InvalidVersion, no ValueError
        raise CertificateFileError(role, path, f"no PEM certificate can be read ({exc})") from None
    problems = []
    for subject, not_before, not_after in fields:
        if now >= not_after:
            days = (now - not_after).days
            message = f"expired on {_day(not_after)} ({days} days ago); clients that check dates refuse it"
            problems.append(DateProblem(Path(path), role, subject, message, True))
        elif now < not_before:
            message = f"is not valid before {_day(not_before)}; is this machine's clock right?"
            problems.append(DateProblem(Path(path), role, subject, message, True))
        elif not_after - now < near:
            days = (not_after - now).days
            message = f"expires on {_day(not_after)} (in {days} days); renew it"
            problems.append(DateProblem(Path(path), role, subject, message, False))
    return problems
