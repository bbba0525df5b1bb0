"""Request parsing: every bad payload gets exactly one of the protocol's ``-ERR`` strings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.statestore import errors
from appliance.statestore.commands import (
    Condition,
    DelCommand,
    GetCommand,
    KeyNotifyCommand,
    SetCommand,
    VDelCommand,
    parse_command,
)
from appliance.statestore.errors import StateStoreError
from appliance.statestore.resp3 import encode_array


def parse(*items: bytes) -> object:
    return parse_command(encode_array(list(items)))


def error_of(payload: bytes) -> str:
    with pytest.raises(StateStoreError) as caught:
        parse_command(payload)
    return caught.value.message


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ((b"GET", b"k"), GetCommand(b"k")),
        ((b"DEL", b"k"), DelCommand(b"k")),
        ((b"VDEL", b"k", b"v"), VDelCommand(b"k", b"v")),
        ((b"KEYNOTIFY", b"k"), KeyNotifyCommand(b"k")),
        ((b"KEYNOTIFY", b"k", b"STOP"), KeyNotifyCommand(b"k", stop=True)),
        ((b"SET", b"k", b"v"), SetCommand(b"k", b"v")),
        ((b"SET", b"k", b""), SetCommand(b"k", b"")),
        ((b"SET", b"k", b"v", b"NX"), SetCommand(b"k", b"v", Condition.NX)),
        ((b"SET", b"k", b"v", b"NEX"), SetCommand(b"k", b"v", Condition.NEX)),
        ((b"SET", b"k", b"v", b"PX", b"10"), SetCommand(b"k", b"v", expire_ms=10)),
        ((b"SET", b"k", b"v", b"NEX", b"PX", b"10000"), SetCommand(b"k", b"v", Condition.NEX, 10000)),
        ((b"SET", b"k", b"v", b"PX", b"5", b"NX"), SetCommand(b"k", b"v", Condition.NX, 5)),
        ((b"SET", b"\x00\xff\r\n", b"\r\n\x00"), SetCommand(b"\x00\xff\r\n", b"\r\n\x00")),  # binary safe
    ],
)
def test_valid_requests(items: tuple[bytes, ...], expected: object) -> None:
    assert parse(*items) == expected


def test_lower_case_verbs_and_options_are_accepted_as_the_documents_examples_send_them() -> None:
    # The protocol document's own examples, byte for byte.
    assert parse_command(b"*3\r\n$3\r\nset\r\n$7\r\nSETKEY2\r\n$6\r\nVALUE5\r\n") == SetCommand(b"SETKEY2", b"VALUE5")
    assert parse_command(b"*2\r\n$3\r\nget\r\n$7\r\nSETKEY2\r\n") == GetCommand(b"SETKEY2")
    assert parse_command(b"*2\r\n$3\r\ndel\r\n$7\r\nSETKEY2\r\n") == DelCommand(b"SETKEY2")
    assert parse_command(b"*3\r\n$4\r\nvdel\r\n$7\r\nSETKEY2\r\n$3\r\nABC\r\n") == VDelCommand(b"SETKEY2", b"ABC")
    assert parse(b"Set", b"k", b"v", b"nex", b"px", b"7") == SetCommand(b"k", b"v", Condition.NEX, 7)
    assert parse(b"keynotify", b"k", b"stop") == KeyNotifyCommand(b"k", stop=True)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", errors.SYNTAX_ERROR),
        (b"*2\r\n$3\r\nGET\r\n$1\r\n", errors.SYNTAX_ERROR),  # truncated
        (b"*2\r\n$3\r\nGET\r\n$2\r\nk\r\n", errors.SYNTAX_ERROR),  # wrong length
        (b"*-1\r\n", errors.SYNTAX_ERROR),
        (b"*0\r\n", errors.SYNTAX_ERROR),
        (b"$3\r\nGET\r\n", errors.SYNTAX_ERROR),  # not an array
        (b"+GET\r\n", errors.SYNTAX_ERROR),
        (b"*2\r\n$3\r\nGET\r\n:5\r\n", errors.SYNTAX_ERROR),  # integer element
        (b"*2\r\n$3\r\nGET\r\n$-1\r\n", errors.SYNTAX_ERROR),  # null element
        (b"*99999999999999999999\r\n", errors.SYNTAX_ERROR),  # overflowing count
        (encode_array([b"GET", b"k"]) + b"x", errors.SYNTAX_ERROR),  # trailing bytes
        (encode_array([b"FLUSHALL"]), errors.UNKNOWN_COMMAND),
        (encode_array([b"GETX", b"k"]), errors.UNKNOWN_COMMAND),
        (encode_array([b"GET"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"GET", b"a", b"b"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"DEL"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"DEL", b"a", b"b"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"VDEL", b"k"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"SET", b"k"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"SET", b"k", b"v", b"NX", b"PX", b"1", b"x", b"y"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"SET", b"k", b"v", b"NX", b"PX", b"1", b"x"]), errors.SYNTAX_ERROR),
        (encode_array([b"KEYNOTIFY"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"KEYNOTIFY", b"k", b"STOP", b"x"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"GET", b""]), errors.KEY_LENGTH_ZERO),
        (encode_array([b"SET", b"", b"v"]), errors.KEY_LENGTH_ZERO),
        (encode_array([b"DEL", b""]), errors.KEY_LENGTH_ZERO),
        (encode_array([b"VDEL", b"", b"v"]), errors.KEY_LENGTH_ZERO),
        (encode_array([b"KEYNOTIFY", b""]), errors.KEY_LENGTH_ZERO),
        (encode_array([b"KEYNOTIFY", b"k", b"START"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"XX"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"NX", b"NEX"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"NX", b"NX"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"PX"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"PX", b"0"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"PX", b"-5"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"PX", b"1.5"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"PX", b"ten"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"PX", b"9999999999999999"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"PX", b"1", b"PX", b"2"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"NEX", b"v"]), errors.SYNTAX_ERROR),  # the document's NEX <value>
    ],
)
def test_bad_requests_get_the_exact_error(payload: bytes, message: str) -> None:
    assert error_of(payload) == message


@given(st.binary(max_size=80))
def test_parser_is_total(payload: bytes) -> None:
    try:
        parse_command(payload)
    except StateStoreError as exc:
        assert exc.message in errors.ALL


commands = st.one_of(
    st.builds(GetCommand, st.binary(min_size=1)),
    st.builds(DelCommand, st.binary(min_size=1)),
    st.builds(VDelCommand, st.binary(min_size=1), st.binary()),
    st.builds(KeyNotifyCommand, st.binary(min_size=1), st.booleans()),
    st.builds(SetCommand, st.binary(min_size=1), st.binary(), st.sampled_from(Condition), st.none() | st.integers(1, 10**12)),
)


@given(commands)
def test_encode_then_parse_round_trips(command: object) -> None:
    assert parse_command(command.encode()) == command  # type: ignore[attr-defined]


def test_encoding_matches_the_sdk_clients_bytes() -> None:
    assert SetCommand(b"testkey", b"testvalue", Condition.NEX).encode() == (
        b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$3\r\nNEX\r\n"
    )
    assert SetCommand(b"testkey", b"testvalue", expire_ms=10).encode() == (
        b"*5\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nPX\r\n$2\r\n10\r\n"
    )
    assert KeyNotifyCommand(b"SOMEKEY").encode() == b"*2\r\n$9\r\nKEYNOTIFY\r\n$7\r\nSOMEKEY\r\n"
