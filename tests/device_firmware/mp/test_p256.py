# Unit tests of device_firmware/p256.py under MicroPython: RFC 6979's P-256/SHA-256 test vector
# (appendix A.2.5, message "sample"), then every way a signature, key or digest can be wrong.
import binascii
import hashlib

import p256
from check import eq

KEY = binascii.unhexlify("60FED4BA255A9D31C961EB74C6356D68C049B8923B61FA6CE669622E60F29FB6"
                         "7903FE1008B8BC99A41AE9E95628BC64F2F1B20C2D7E9F5177A3C294D4462299")
SIG = binascii.unhexlify("EFD48B2AACB6A8FD1140DD9CD45E81D69D2C877B56AAF991C34D0EA84EAF3716"
                         "F7CB1C942D657C41D436C7A1B6E29F65F3E900DBB9AFF4064DC4AB2F843ACDA8")
DIGEST = hashlib.sha256(b"sample").digest()
N = binascii.unhexlify("FFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551")


def test_the_rfc_6979_signature_verifies():
    eq(p256.verify(KEY, DIGEST, SIG), True)


def test_another_message_or_a_flipped_bit_does_not():
    eq(p256.verify(KEY, hashlib.sha256(b"samplf").digest(), SIG), False)
    for i in (0, 31, 32, 63):
        bad = bytearray(SIG)
        bad[i] ^= 1
        eq(p256.verify(KEY, DIGEST, bytes(bad)), False)


def test_a_key_off_the_curve_or_out_of_range_values_are_refused():
    off = bytearray(KEY)
    off[63] ^= 1
    eq(p256.verify(bytes(off), DIGEST, SIG), False)
    eq(p256.verify(KEY, DIGEST, bytes(32) + SIG[32:]), False)  # r = 0
    eq(p256.verify(KEY, DIGEST, SIG[:32] + N), False)  # s = n
    eq(p256.verify(KEY, DIGEST, b"\xff" * 64), False)
    eq(p256.verify(KEY[:63], DIGEST, SIG), False)
    eq(p256.verify(KEY, DIGEST[:31], SIG), False)
    eq(p256.verify(KEY, DIGEST, SIG + b"\x00"), False)
