"""Username/password authentication from a mosquitto-compatible password file.

Why it is built this way:

* The file format is mosquitto's (``mosquitto_passwd``), so a site moving from mosquitto keeps its file:
  one ``user:hash`` per line, where the hash is ``$7$<iterations>$<b64 salt>$<b64 digest>``
  (PBKDF2-HMAC-SHA512, mosquitto 2.x) or ``$6$<b64 salt>$<b64 digest>`` (SHA-512 of password + salt,
  mosquitto 1.x). We read both and write ``$7$`` with ``DEFAULT_ITERATIONS`` (mosquitto writes 101,
  which is too few for a device that may be stolen). mosquitto verifies our entries unchanged.
* PBKDF2 is deliberately slow (tens of milliseconds), so it must not run on the event loop. ``check``
  and ``verify_password`` are pure, thread-safe, blocking functions: the server calls
  ``check_cached`` first (anonymous clients, and clients that already proved the same password, answer
  without hashing) and only when that returns None runs ``check`` in an executor
  (``loop.run_in_executor(None, authenticator.check, username, password)``).
* An ``Authenticator`` is immutable apart from its verification cache. Reloading (SIGHUP) builds a new
  one with ``Authenticator.load``; the server swaps its reference in one assignment, so a check never
  sees half a file. A bad file raises ``PasswordFileError`` and the caller keeps the old object.
* Policy, the same as mosquitto's: a client without a username is accepted only if anonymous access is
  allowed. With a password file, a client with a username must match an entry. Without a password file
  a username is accepted as an unverified name (used by ACLs) only when anonymous access is allowed.
  Reason codes are the caller's choice: 0x87 (not authorized) when no username was given, 0x86 (bad
  user name or password) otherwise.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from appliance import atomic_file
from appliance.startup_error import StartupError

#: PBKDF2-HMAC-SHA512 rounds for new entries (OWASP 2023 guidance for SHA-512 is 210,000).
DEFAULT_ITERATIONS = 210_000
SALT_BYTES = 12  # what mosquitto_passwd uses; both sides accept any length


class PasswordFileError(StartupError, ValueError):
    """A password file that cannot be read, or a malformed line of it (``line``)."""


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """One decoded entry: ``scheme`` is "7" (PBKDF2-SHA512; ``iterations`` > 0) or "6" (salted SHA-512)."""

    scheme: str
    iterations: int
    salt: bytes
    digest: bytes

    def encode(self) -> str:
        """The ``$7$...`` / ``$6$...`` text as it appears after ``user:`` in the file."""
        salt = base64.b64encode(self.salt).decode("ascii")
        digest = base64.b64encode(self.digest).decode("ascii")
        if self.scheme == "7":
            return f"$7${self.iterations}${salt}${digest}"
        return f"$6${salt}${digest}"


def parse_hash(text: str) -> PasswordHash:
    """Decode ``$7$<iterations>$<salt>$<digest>`` or ``$6$<salt>$<digest>``; ValueError if malformed."""
    parts = text.split("$")
    try:
        if len(parts) == 5 and parts[0] == "" and parts[1] == "7":
            iterations = int(parts[2])
            if iterations < 1:
                raise ValueError("iteration count must be positive")
            return PasswordHash("7", iterations, _b64(parts[3]), _b64(parts[4]))
        if len(parts) == 4 and parts[0] == "" and parts[1] == "6":
            return PasswordHash("6", 0, _b64(parts[2]), _b64(parts[3]))
    except (ValueError, binascii.Error) as exc:
        raise ValueError(f"bad password hash: {exc}") from exc
    raise ValueError("not a $7$ (PBKDF2-SHA512) or $6$ (SHA-512) password hash")


def _b64(text: str) -> bytes:
    if not text:
        raise ValueError("empty base64 field")
    return base64.b64decode(text, validate=True)


def hash_password(password: str | bytes, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> PasswordHash:
    """A new ``$7$`` entry for ``password`` with a random salt (blocking: PBKDF2)."""
    if iterations < 1:
        raise ValueError("iterations must be positive")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    return PasswordHash("7", iterations, salt, _digest("7", iterations, salt, _as_bytes(password)))


def verify_password(stored: PasswordHash, password: str | bytes) -> bool:
    """Whether ``password`` matches ``stored``, compared in constant time. Blocking: run in an executor."""
    return hmac.compare_digest(_digest(stored.scheme, stored.iterations, stored.salt, _as_bytes(password)), stored.digest)


def _digest(scheme: str, iterations: int, salt: bytes, password: bytes) -> bytes:
    if scheme == "7":
        return hashlib.pbkdf2_hmac("sha512", password, salt, iterations)
    return hashlib.sha512(password + salt).digest()


def _as_bytes(password: str | bytes) -> bytes:
    return password.encode("utf-8") if isinstance(password, str) else password


def parse_password_file(text: str, source: str = "<password file>") -> dict[str, PasswordHash]:
    """Entries of a password file; blank lines and ``#`` comments are skipped.

    Raises ``PasswordFileError`` naming ``source`` and the line for a line without ``:``, a plain-text
    password, a bad hash or a duplicate user.
    """
    entries: dict[str, PasswordHash] = {}
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.rstrip("\r\n")
        if not line.strip() or line.startswith("#"):
            continue
        username, sep, encoded = line.partition(":")
        if not sep or not username:
            raise PasswordFileError(source, "expected user:hash", line=number)
        if username in entries:
            raise PasswordFileError(source, f"user {username!r} appears twice", line=number)
        try:
            entries[username] = parse_hash(encoded)
        except ValueError as exc:
            raise PasswordFileError(source, f"user {username!r}: {exc}", line=number) from exc
    return entries


def read_password_file(path: Path) -> dict[str, PasswordHash]:
    """Read and parse ``path``; ``PasswordFileError`` if it cannot be read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PasswordFileError(path, f"cannot read password file: {exc}") from exc
    return parse_password_file(text, str(path))


def format_password_file(entries: Mapping[str, PasswordHash]) -> str:
    return "".join(f"{username}:{stored.encode()}\n" for username, stored in entries.items())


def write_password_file(path: Path, entries: Mapping[str, PasswordHash]) -> None:
    """Replace ``path`` atomically (temporary file, fsync, rename), readable by the owner only.

    A crash mid-write leaves the old file, never a truncated one that would lock every user out.
    """
    for username in entries:
        if not username or ":" in username or "\n" in username:
            raise ValueError(f"user name {username!r} cannot be stored (empty, or contains ':' or a newline)")
    atomic_file.write_bytes(path, format_password_file(entries).encode("utf-8"), mode=0o600)


# Verified against for unknown users so that "no such user" costs as long as "wrong password".
_DECOY = PasswordHash("7", DEFAULT_ITERATIONS, b"\x00" * SALT_BYTES, b"\x00" * 64)


class Authenticator:
    """Decides CONNECT credentials. Build with ``load``; replace the whole object to reload."""

    def __init__(self, entries: Mapping[str, PasswordHash] | None, allow_anonymous: bool) -> None:
        """``entries`` None means no password file is configured (different from an empty file)."""
        self._entries = dict(entries) if entries is not None else None
        self.allow_anonymous = allow_anonymous
        # username -> keyed fast hash of a password that passed ``check``; never leaves this process.
        self._proven: dict[str, bytes] = {}
        self._cache_key = secrets.token_bytes(32)

    @classmethod
    def load(cls, password_file: Path | None, allow_anonymous: bool) -> Authenticator:
        """Read ``password_file`` (None: no file). Raises ``PasswordFileError``; e.g. from ``AuthConfig``."""
        entries = read_password_file(password_file) if password_file is not None else None
        return cls(entries, allow_anonymous)

    @property
    def usernames(self) -> frozenset[str]:
        return frozenset(self._entries or ())

    def check_cached(self, username: str | None, password: str | bytes | None) -> bool | None:
        """The verdict if it needs no hashing (call on the event loop), else None: then call ``check``."""
        if username is None:
            return self.allow_anonymous
        if self._entries is None:
            return self.allow_anonymous
        if password is None:
            return False
        proven = self._proven.get(username)
        if proven is not None and hmac.compare_digest(proven, self._fingerprint(password)):
            return True
        return None

    def check(self, username: str | None, password: str | bytes | None) -> bool:
        """Whether these CONNECT credentials are accepted. Blocking (PBKDF2): run it in an executor."""
        quick = self.check_cached(username, password)
        # check_cached decides every case without a username, a password or a password file.
        if quick is not None or username is None or password is None or self._entries is None:
            return bool(quick)
        stored = self._entries.get(username)
        if stored is None:
            verify_password(_DECOY, password)
            return False
        if not verify_password(stored, password):
            return False
        self._proven[username] = self._fingerprint(password)
        return True

    def _fingerprint(self, password: str | bytes) -> bytes:
        return hmac.new(self._cache_key, _as_bytes(password), hashlib.sha256).digest()
