"""The sans-I/O AT framing: byte strings in, events out, no serial port."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.hardware.at import (
    MAX_LINE,
    AtConnection,
    Event,
    Noise,
    ProtocolError,
    Response,
    Urc,
    reply_prefix,
)


def events(conn: AtConnection) -> list[Event]:
    out = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def test_send_frames_one_command_with_a_carriage_return() -> None:
    assert AtConnection().send("AT+CSQ") == b"AT+CSQ\r"


def test_echo_info_lines_and_ok_make_one_response() -> None:
    conn = AtConnection()
    conn.send("AT+CSQ")
    conn.receive_data(b"AT+CSQ\r\r\n+CSQ: 20,99\r\n\r\nOK\r\n")
    assert events(conn) == [Response("AT+CSQ", ("+CSQ: 20,99",), "OK")]
    assert conn.pending is None


def test_a_reply_split_at_every_byte_gives_the_same_response() -> None:
    conn = AtConnection()
    conn.send("AT+COPS?")
    for byte in b'\r\n+COPS: 0,0,"Op, Inc",7\r\n\r\nOK\r\n':
        conn.receive_data(bytes([byte]))
    assert events(conn) == [Response("AT+COPS?", ('+COPS: 0,0,"Op, Inc",7',), "OK")]


@pytest.mark.parametrize("final", ["ERROR", "+CME ERROR: 10", "+CMS ERROR: 500", "NO CARRIER"])
def test_error_result_codes_end_the_command(final: str) -> None:
    conn = AtConnection()
    conn.send("AT+CPIN?")
    conn.receive_data(f"\r\n{final}\r\n".encode())
    [response] = events(conn)
    assert isinstance(response, Response) and not response.ok and response.result == final


def test_urcs_between_info_lines_are_reported_apart_from_the_response() -> None:
    conn = AtConnection()
    conn.send("AT+CSQ")
    conn.receive_data(b"\r\n+CREG: 5\r\n\r\n+CSQ: 9,0\r\n\r\nRING\r\n\r\nOK\r\n")
    assert events(conn) == [Urc("+CREG: 5"), Urc("RING"), Response("AT+CSQ", ("+CSQ: 9,0",), "OK")]


def test_lines_with_no_command_pending_are_urcs_or_noise() -> None:
    conn = AtConnection()
    conn.receive_data(b"\r\nRDY\r\n\x00\xff\x13garbage\r\n+CPIN: READY\r\nOK\r\n")
    assert events(conn) == [Urc("RDY"), Noise("\x00\ufffd\x13garbage"), Urc("+CPIN: READY"), Noise("OK")]


def test_garbage_while_a_prefixed_command_is_pending_is_noise_not_an_info_line() -> None:
    conn = AtConnection()
    conn.send("AT+CSQ")
    conn.receive_data(b"\r\n#$%\r\n+CSQ: 5,5\r\nOK\r\n")
    assert events(conn) == [Noise("#$%"), Response("AT+CSQ", ("+CSQ: 5,5",), "OK")]


def test_basic_commands_keep_free_text_info_lines() -> None:
    conn = AtConnection()
    conn.send("ATI")
    conn.receive_data(b"ATI\r\r\nQuectel\r\nEC25\r\nRevision: EC25EFAR06A03M4G\r\n\r\nOK\r\n")
    assert events(conn) == [Response("ATI", ("Quectel", "EC25", "Revision: EC25EFAR06A03M4G"), "OK")]


def test_abandoned_command_turns_its_late_reply_into_noise() -> None:
    conn = AtConnection()
    conn.send("AT+CSQ")
    conn.abandon()
    conn.receive_data(b"\r\n+CSQ: 1,1\r\n\r\nOK\r\n")
    assert events(conn) == [Urc("+CSQ: 1,1"), Noise("OK")]
    assert conn.send("AT") == b"AT\r"


def test_a_second_command_before_the_result_is_refused() -> None:
    conn = AtConnection()
    conn.send("AT")
    with pytest.raises(ProtocolError, match="still waiting"):
        conn.send("AT+CSQ")


@pytest.mark.parametrize("bad", ["CSQ", "AT\rAT", "AT+X\n"])
def test_only_single_at_commands_can_be_sent(bad: str) -> None:
    with pytest.raises(ProtocolError):
        AtConnection().send(bad)


def test_an_endless_line_is_dropped_as_noise_instead_of_growing_the_buffer() -> None:
    conn = AtConnection()
    conn.receive_data(b"x" * (MAX_LINE + 1))
    [noise] = events(conn)
    assert isinstance(noise, Noise) and len(noise.data) == MAX_LINE + 1
    conn.receive_data(b"\r\nRDY\r\n")
    assert events(conn) == [Urc("RDY")]


@pytest.mark.parametrize(
    ("command", "prefix"),
    [
        ("AT+CSQ", "+CSQ:"),
        ("AT+CREG?", "+CREG:"),
        ("at+cops=?", "+COPS:"),
        ("AT+CGDCONT=1,\"IP\"", "+CGDCONT:"),
        ("ATI", None),
        ("ATE0", None),
    ],
)
def test_reply_prefix(command: str, prefix: str | None) -> None:
    assert reply_prefix(command) == prefix


@given(st.binary(max_size=300), st.lists(st.integers(min_value=1, max_value=40), max_size=20))
def test_any_bytes_split_anywhere_still_let_a_later_reply_through(garbage: bytes, cuts: list[int]) -> None:
    """Noise never wedges the parser: after it, a fresh command's reply is still recognised."""
    conn = AtConnection()
    data = garbage + b"\r\n"
    position = 0
    for cut in cuts:
        conn.receive_data(data[position : position + cut])
        position += cut
    conn.receive_data(data[position:])
    events(conn)
    conn.send("AT+CSQ")
    conn.receive_data(b"\r\n+CSQ: 3,4\r\n\r\nOK\r\n")
    assert events(conn)[-1] == Response("AT+CSQ", ("+CSQ: 3,4",), "OK")
