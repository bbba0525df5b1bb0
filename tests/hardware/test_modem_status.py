"""Parsing of +CSQ, +CREG/+CEREG and +COPS reply lines into typed readings."""

from __future__ import annotations

import pytest

from appliance.hardware.modem_status import (
    ModemStatus,
    Operator,
    Registration,
    ReplyError,
    Signal,
    parse_cops,
    parse_csq,
    parse_registration,
)


@pytest.mark.parametrize(
    ("line", "signal"),
    [("+CSQ: 0,0", Signal(-113, 0)), ("+CSQ: 31,7", Signal(-51, 7)), ("+CSQ: 99,99", Signal(None, None))],
)
def test_csq_maps_rssi_to_dbm_and_99_to_unknown(line: str, signal: Signal) -> None:
    assert parse_csq(line) == signal


@pytest.mark.parametrize("line", ["+CSQ: 32,0", "+CSQ: 5", "+CSQ: a,b", "+CREG: 0,1"])
def test_bad_csq_lines_are_rejected(line: str) -> None:
    with pytest.raises(ReplyError):
        parse_csq(line)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("+CREG: 0,1", ("CREG", Registration.HOME)),
        ("+CEREG: 2,5,\"1A2B\",\"01C3F001\",7", ("CEREG", Registration.ROAMING)),
        ("+CEREG: 3", ("CEREG", Registration.DENIED)),  # URC form: <stat> first
        ("+CREG: 1,\"0012\",\"0034\"", ("CREG", Registration.HOME)),  # URC with all-digit quoted LAC
    ],
)
def test_registration_read_replies_and_urcs(line: str, expected: tuple[str, Registration]) -> None:
    assert parse_registration(line) == expected


@pytest.mark.parametrize("line", ["+CREG: 0,9", "+CSQ: 1,1", "+CEREG: x"])
def test_bad_registration_lines_are_rejected(line: str) -> None:
    with pytest.raises(ReplyError):
        parse_registration(line)


def test_cops_with_quoted_name_containing_a_comma_and_technology() -> None:
    assert parse_cops('+COPS: 0,0,"Op, Inc",7') == Operator("Op, Inc", "LTE")


def test_cops_when_not_registered_has_only_the_mode() -> None:
    assert parse_cops("+COPS: 0") == Operator(None, None)


def test_metrics_say_registered_if_either_network_is() -> None:
    status = ModemStatus(responding=True, registration={"CREG": Registration.SEARCHING, "CEREG": Registration.ROAMING})
    metrics = status.as_metrics()
    assert metrics["registered"] is True
    assert metrics["registration"] == "CEREG=roaming,CREG=searching"
    assert metrics["rssi_dbm"] is None and metrics["operator"] is None
