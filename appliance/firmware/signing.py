"""ECDSA P-256 over a version's device manifest: what the thermostats check, and what the gateway checks
first so it never publishes a version its fleet would refuse.

A signature is the 64 bytes r||s the device's ``p256.py`` takes, over sha256(``manifest.txt``); a public
key is written as the device config's ``update.key`` holds it: hex of X||Y (128 digits). ECDSA signatures
are randomized, so "the same signature" means "verifies with the same key", never equal bytes.

``cryptography`` is imported by the functions that sign and verify, which only ``appliance firmware``
runs: the gateway process reads ``[firmware] keys`` in its config (``point_from_hex``, plain integer
arithmetic) and would otherwise carry the library's resident memory for nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

#: P-256 (secp256r1): the field prime and the curve's b (y^2 = x^3 - 3x + b), FIPS 186-4 D.1.2.3.
P256_P = 2**256 - 2**224 + 2**192 + 2**96 - 1
P256_B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B


class SigningError(Exception):
    """A key or signature that cannot be used (the message says why)."""


def load_signing_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """An EC P-256 private key from a PEM file (e.g. ``openssl ecparam -name prime256v1 -genkey -noout``)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SigningError(f"{path}: not a PEM private key without a password ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise SigningError(f"{path}: not an ECDSA P-256 (prime256v1) key")
    return key


def sign(data: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    """ECDSA P-256 over sha256(data), as r||s (32 bytes each, big-endian)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def public_key_hex(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> str:
    """The device config's ``update.key``: X||Y of the public key, hex."""
    from cryptography.hazmat.primitives.asymmetric import ec

    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    numbers = public.public_numbers()
    return (numbers.x.to_bytes(32, "big") + numbers.y.to_bytes(32, "big")).hex()


def point_from_hex(text: str) -> tuple[int, int]:
    """``update.key`` text as the point (x, y): 128 hex digits of X||Y, on P-256 (checked here, without
    ``cryptography``)."""
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise SigningError("not hex (128 digits of X||Y, as `appliance firmware public-key` prints)") from None
    if len(raw) != 64:
        raise SigningError(f"{len(raw)} bytes, not 64 (X||Y of a P-256 key)")
    x, y = int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")
    if not (x < P256_P and y < P256_P and (y * y - (x * x * x - 3 * x + P256_B)) % P256_P == 0):
        raise SigningError("not a point of P-256")
    return x, y


def public_key_from_hex(text: str) -> ec.EllipticCurvePublicKey:
    """``update.key`` text back to a key."""
    from cryptography.hazmat.primitives.asymmetric import ec

    x, y = point_from_hex(text)
    return ec.EllipticCurvePublicNumbers(x, y, ec.SECP256R1()).public_key()


def verifies(data: bytes, signature: bytes, key: ec.EllipticCurvePublicKey) -> bool:
    """Whether ``signature`` (r||s) is ``key``'s over sha256(data), as the thermostat checks it."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    if len(signature) != 64:
        return False
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
    try:
        key.verify(der, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def signer_among(data: bytes, signature: bytes, keys: list[str] | tuple[str, ...]) -> str | None:
    """The first of ``keys`` (hex) whose signature ``signature`` is over ``data``, or None."""
    return next((key for key in keys if verifies(data, signature, public_key_from_hex(key))), None)
