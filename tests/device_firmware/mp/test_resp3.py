# Unit tests of device_firmware/resp3.py under MicroPython.
import resp3
from check import eq, raises


def test_encode_command_is_array_of_bulk_strings():
    eq(resp3.encode_command("GET", "SOMEKEY"), b"*2\r\n$3\r\nGET\r\n$7\r\nSOMEKEY\r\n")


def test_encode_is_binary_safe():
    eq(resp3.encode_command("SET", b"k\r\n", b"\x00"), b"*3\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$1\r\n\x00\r\n")


def test_decode_replies():
    eq(resp3.decode(b"+OK\r\n"), "OK")
    eq(resp3.decode(b":1\r\n"), 1)
    eq(resp3.decode(b":-1\r\n"), -1)
    eq(resp3.decode(b"$-1\r\n"), None)
    eq(resp3.decode(b"_\r\n"), None)
    eq(resp3.decode(b"$4\r\n1234\r\n"), b"1234")
    eq(resp3.decode(b"$0\r\n\r\n"), b"")
    eq(resp3.decode(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n"),
       [b"NOTIFY", b"SET", b"VALUE", b"abc"])


def test_bulk_string_may_contain_crlf():
    eq(resp3.decode(b"$4\r\na\r\nb\r\n"), b"a\r\nb")


def test_error_reply_is_returned_not_raised():
    err = resp3.decode(b"-ERR syntax error\r\n")
    eq(isinstance(err, resp3.Resp3Error), True)
    eq(str(err), "syntax error")
    eq(str(resp3.decode(b"-ERR: wrong number of arguments\r\n")), "wrong number of arguments")


def test_malformed_replies_raise():
    for bad in (b"", b"+OK", b"$5\r\nabc\r\n", b"$3\r\nabcd\r\n", b":1x\r\n", b":\r\n", b"*2\r\n$1\r\na\r\n",
                b"?\r\n", b"$-2\r\n", b"+OK\r\n+OK\r\n", b"*-3\r\n"):
        raises(ValueError, resp3.decode, bad)


def test_decode_in_place_returns_views_of_a_memoryview():
    buf = bytearray(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n")
    message = resp3.decode(memoryview(buf))
    eq(type(message[3]), memoryview)
    buf[-3] = ord("C")
    eq(bytes(message[3]), b"abC")


def test_partial_decode_reports_a_cut_off_bulk_string_by_its_size():
    head = b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$5000\r\nxyz"
    message = resp3.decode(memoryview(head), True)
    eq([bytes(m) for m in message[:3]], [b"NOTIFY", b"SET", b"VALUE"])
    eq(message[3].size, 5000)
    eq(resp3.decode(b"$70000\r\n12", True).size, 70000)
    raises(ValueError, resp3.decode, b"$70000\r\n12")


def test_the_gateways_strictness_rules_apply():
    # The gateway's resp3.py rules (docs/statestore.md), so both read the same bytes the same way.
    for bad in (b":007\r\n", b"$03\r\nabc\r\n", b":-0\r\n", b"+O\rK\r\n", b":9223372036854775808\r\n",
                b":-9223372036854775809\r\n", b"*1\r\n" * 9 + b":1\r\n"):
        raises(ValueError, resp3.decode, bad)
    eq(resp3.decode(b":9223372036854775807\r\n"), 9223372036854775807)
    eq(resp3.decode(b":-9223372036854775808\r\n"), -9223372036854775808)
    eq(resp3.decode(b"*1\r\n" * 8 + b":1\r\n"), [[[[[[[[1]]]]]]]])


def test_nesting_is_refused_before_it_can_exhaust_the_stack():
    # A 512-byte receive buffer holds 128 levels of "*1\r\n": refused at the ninth, not recursed into.
    raises(ValueError, resp3.decode, b"*1\r\n" * 128 + b":1\r\n")
