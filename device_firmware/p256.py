"""ECDSA P-256 signature verification in plain MicroPython (no ussl, no native code).

Used once per over-the-air update, on the firmware manifest, and unloaded after: `ota.py` imports it
only to check the signature. Jacobian coordinates with a = -3 and Shamir's trick (u1*G + u2*Q in one
pass of 256 doublings), so the only inversions are the two `pow(x, m - 2, m)` at the ends. On the
unix port it needs about 9 KB of free heap (big integers of 256-512 bits come and go) and 25-40 ms.
The public key is the 64-byte uncompressed point X||Y, the signature the 64-byte r||s (the form
`appliance firmware publish --key` writes); the message is a sha256 digest.
"""

from micropython import const

_P = const(0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF)
_N = const(0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551)
_B = const(0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B)
_GX = const(0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296)
_GY = const(0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5)


def _double(pt):
    x, y, z = pt
    if not y:
        return (0, 1, 0)
    zz = z * z % _P
    m = 3 * (x - zz) * (x + zz) % _P  # a = -3
    yy = y * y % _P
    s = 4 * x * yy % _P
    x3 = (m * m - 2 * s) % _P
    return (x3, (m * (s - x3) - 8 * yy * yy) % _P, 2 * y * z % _P)


def _add(p1, p2):
    if not p1[2]:
        return p2
    if not p2[2]:
        return p1
    x1, y1, z1 = p1
    x2, y2, z2 = p2
    z1z1 = z1 * z1 % _P
    z2z2 = z2 * z2 % _P
    u1 = x1 * z2z2 % _P
    u2 = x2 * z1z1 % _P
    s1 = y1 * z2 * z2z2 % _P
    s2 = y2 * z1 * z1z1 % _P
    h = (u2 - u1) % _P
    r = (s2 - s1) % _P
    if not h:
        return _double(p1) if not r else (0, 1, 0)
    hh = h * h % _P
    hhh = h * hh % _P
    v = u1 * hh % _P
    x3 = (r * r - hhh - 2 * v) % _P
    return (x3, (r * (v - x3) - s1 * hhh) % _P, z1 * z2 * h % _P)


def verify(public_key, digest, signature) -> bool:
    """True if `signature` (r||s, 64 bytes) signs the 32-byte `digest` for `public_key` (X||Y, 64 bytes).
    False for anything malformed: a key not on the curve, r or s out of range, wrong lengths."""
    if len(public_key) != 64 or len(signature) != 64 or len(digest) != 32:
        return False
    qx = int.from_bytes(public_key[:32], "big")
    qy = int.from_bytes(public_key[32:], "big")
    if qx >= _P or qy >= _P or (qy * qy - qx * qx * qx + 3 * qx - _B) % _P:
        return False
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:], "big")
    if not (0 < r < _N and 0 < s < _N):
        return False
    w = pow(s, _N - 2, _N)
    u1 = int.from_bytes(digest, "big") * w % _N
    u2 = r * w % _N
    g = (_GX, _GY, 1)
    q = (qx, qy, 1)
    both = _add(g, q)
    acc = (0, 1, 0)
    for bit in range(255, -1, -1):
        acc = _double(acc)
        pick = ((u1 >> bit) & 1) | (((u2 >> bit) & 1) << 1)
        if pick:
            acc = _add(acc, (g, q, both)[pick - 1])
    if not acc[2]:
        return False
    zinv = pow(acc[2], _P - 2, _P)
    return acc[0] * zinv * zinv % _P % _N == r
