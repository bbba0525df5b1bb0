"""The RESP3 decoder is total (any bytes -> value or Resp3Error) and strict; encoders round-trip."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.statestore import resp3
from appliance.statestore.resp3 import ErrorReply, Resp3Error, SimpleString


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"+OK\r\n", SimpleString(b"OK")),
        (b"-ERR syntax error\r\n", ErrorReply(b"ERR syntax error")),
        (b":-1\r\n", -1),
        (b":0\r\n", 0),
        (b"$-1\r\n", None),
        (b"_\r\n", None),  # the RESP3 null
        (b":9223372036854775807\r\n", 2**63 - 1),
        (b":-9223372036854775808\r\n", -(2**63)),
        (b"$0\r\n\r\n", b""),
        (b"$4\r\n1234\r\n", b"1234"),
        (b"$4\r\na\r\nb\r\n", b"a\r\nb"),  # binary safe: CRLF inside a bulk string
        (b"*0\r\n", []),
        (b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", [b"GET", b"k"]),
        (b"*1\r\n*1\r\n:5\r\n", [[5]]),
    ],
)
def test_decodes_well_formed_values(data: bytes, expected: object) -> None:
    assert resp3.decode(data) == expected


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"+OK",  # no CRLF
        b"+OK\n",
        b"*2\r\n$3\r\nGET\r\n",  # truncated array
        b"$5\r\nabc\r\n",  # length longer than data
        b"$2\r\nabc\r\n",  # length shorter than data
        b"$3\r\nabcXY",  # data not followed by CRLF
        b"$-2\r\n",
        b"*-2\r\n",
        b"$03\r\nabc\r\n",  # leading zero
        b"$+3\r\nabc\r\n",
        b"$ 3\r\nabc\r\n",
        b":-0\r\n",
        b":9223372036854775808\r\n",  # beyond a signed 64-bit integer
        b":-9223372036854775809\r\n",
        b"_x\r\n",  # the RESP3 null has no content
        b"$99999999999999999999\r\n",  # overflowing length
        b"*3\r\n",
        b"+OK\r\nextra",  # trailing bytes
        b"+OK\r\n+OK\r\n",
        b"%1\r\n",  # a RESP3 map: not in the subset
        b"GET key\r\n",  # inline command
        b"*1\r\n" * 20 + b":1\r\n",  # nested too deep
    ],
)
def test_rejects_malformed_input(data: bytes) -> None:
    with pytest.raises(Resp3Error):
        resp3.decode(data)


@given(st.binary(max_size=64))
def test_decode_is_total(data: bytes) -> None:
    with contextlib.suppress(Resp3Error):
        resp3.decode(data)


@given(st.lists(st.binary(max_size=40), max_size=8))
def test_arrays_of_bulk_strings_round_trip(items: list[bytes]) -> None:
    assert resp3.decode(resp3.encode_array(items)) == items


@given(st.lists(st.binary(max_size=12), min_size=1, max_size=4), st.data())
def test_every_truncation_of_a_valid_request_is_rejected(items: list[bytes], data: st.DataObject) -> None:
    encoded = resp3.encode_array(items)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(Resp3Error):
        resp3.decode(encoded[:cut])


def test_encoders_produce_the_wire_forms_the_sdk_clients_match() -> None:
    assert resp3.OK == b"+OK\r\n"
    assert resp3.encode_integer(-1) == b":-1\r\n"
    assert resp3.encode_integer(1) == b":1\r\n"
    assert resp3.encode_bulk(None) == b"$-1\r\n"
    assert resp3.encode_bulk(b"1234") == b"$4\r\n1234\r\n"
    assert resp3.encode_error("syntax error") == b"-ERR syntax error\r\n"
