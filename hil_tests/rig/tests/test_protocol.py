"""The serial protocol without a serial port: framing, every command, every kind of bad line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hil_tests.rig.kernel import drop_rules
from hil_tests.rig.protocol import (
    FEATURES,
    Apply,
    CommandError,
    LineBuffer,
    Reply,
    RigState,
    Status,
)
from hil_tests.rig.shaping import LinkSettings

ALL = frozenset(FEATURES)


def test_line_buffer_joins_partial_reads_and_strips_crlf():
    buffer = LineBuffer()
    assert list(buffer.feed(b"RA")) == []
    assert list(buffer.feed(b"TE 96")) == []
    assert list(buffer.feed(b"00\r\nUP\nST")) == ["RATE 9600", "UP"]
    assert list(buffer.feed(b"ATUS\n")) == ["STATUS"]


def test_line_buffer_turns_overlong_and_non_ascii_lines_into_errors_and_recovers():
    buffer = LineBuffer()
    assert list(buffer.feed(b"X" * 200)) == []
    assert list(buffer.feed(b"X" * 50)) == []
    first, second, third = buffer.feed(b"tail\nRATE \xff\nUP\n")
    assert isinstance(first, CommandError) and "longer than 128" in str(first)
    assert isinstance(second, CommandError) and "ASCII" in str(second)
    assert third == "UP"
    (whole,) = buffer.feed(b"Y" * 129 + b"\n")
    assert isinstance(whole, CommandError)


@pytest.mark.parametrize(
    ("line", "settings"),
    [
        ("RATE 9600", LinkSettings(rate_bps=9600)),
        ("rate 64000 3000", LinkSettings(rate_bps=64000, burst_bytes=3000)),
        ("RATE 0", LinkSettings(rate_bps=0)),
        ("DELAY 150", LinkSettings(delay_ms=150)),
        ("DELAY 12.5", LinkSettings(delay_ms=12.5)),
        ("JITTER 20", LinkSettings(jitter_ms=20)),
        ("LOSS 2.5", LinkSettings(loss_pct=2.5)),
        ("  down ", LinkSettings(up=False)),
        ("UP", LinkSettings(up=True)),
    ],
)
def test_each_setting_command_proposes_its_settings_and_echoes_itself(line, settings):
    state = RigState("userspace", ALL)
    action = state.handle(line)
    assert isinstance(action, Apply)
    assert action.settings == settings
    assert action.line == "OK " + " ".join(line.split()).upper()
    assert state.settings == LinkSettings()  # nothing changes before the backend confirmed
    state.commit(action.settings)
    assert state.settings == settings


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("FLY", "unknown command 'FLY'"),
        ("RATE", "RATE: expected RATE <bits/s> [<burst bytes>], got 0 arguments"),
        ("RATE 1 2 3", "got 3 arguments"),
        ("RATE -5", "expected a whole non-negative number, got '-5'"),
        ("RATE 9600.5", "whole"),
        ("RATE 1e6", "whole"),
        ("RATE 9600 100", "burst_bytes must be between 1600"),
        ("RATE 99999999999", "rate_bps must be between"),
        ("DELAY", "expected 1 argument"),
        ("DELAY nan", "non-negative number"),
        ("DELAY inf", "non-negative number"),
        ("DELAY 60001", "delay_ms must be between"),
        ("LOSS 100", "below 100"),
        ("LOSS -1", "non-negative"),
        ("DOWN now", "expected no arguments"),
        ("STATUS all", "expected no arguments"),
    ],
)
def test_malformed_commands_get_err_with_a_reason_and_change_nothing(line, reason):
    state = RigState("userspace", ALL)
    action = state.handle(line)
    assert isinstance(action, Reply)
    assert action.line.startswith("ERR ")
    assert reason in action.line
    assert state.settings == LinkSettings()


def test_blank_lines_are_ignored():
    assert RigState("userspace", ALL).handle("   ") is None


def test_a_backend_without_a_feature_refuses_it_but_accepts_its_default_value():
    state = RigState("netns", frozenset({"rate", "loss", "down"}))
    refused = state.handle("DELAY 10")
    assert refused == Reply("ERR DELAY not supported by backend netns")
    assert isinstance(state.handle("DELAY 0"), Apply)
    assert isinstance(state.handle("RATE 9600"), Apply)


def test_status_lists_settings_features_in_protocol_order_and_backend_details():
    state = RigState("netns", frozenset({"down", "rate"}))
    state.commit(LinkSettings(rate_bps=9600, loss_pct=2.5, up=False))
    assert isinstance(state.handle("status"), Status)
    assert state.status_line({"gateway_ns": "hilrig-x-gw"}) == (
        "OK backend=netns up=0 rate=9600 burst=1600 delay=0 jitter=0 loss=2.5 features=rate,down restarted=0 "
        "gateway_ns=hilrig-x-gw"
    )


def test_status_says_restarted_when_the_rig_undid_what_a_dead_one_left():
    state = RigState("bridge", ALL)
    state.restarted = True
    assert "restarted=1" in state.status_line({}).split()


def test_rate_without_a_burst_goes_back_to_the_default_burst():
    """Issue 26 section 6: ``RATE 9600`` after ``RATE 64000 16000`` kept the 16 kB burst, 13 s of the slow
    link let through at once; PROTOCOL.md's table says the burst defaults to 1600."""
    state = RigState("bridge", ALL)
    action = state.handle("RATE 64000 16000")
    assert isinstance(action, Apply)
    state.commit(action.settings)
    assert state.handle("RATE 9600") == Apply(LinkSettings(rate_bps=9600, burst_bytes=1600), "OK RATE 9600")


def test_reset_proposes_the_defaults():
    state = RigState("userspace", ALL)
    state.commit(LinkSettings(rate_bps=9600, delay_ms=100, up=False))
    assert state.handle("RESET") == Apply(LinkSettings(), "OK RESET")


@given(st.lists(st.binary(max_size=200), max_size=20))
def test_any_bytes_get_one_reply_per_nonblank_line_and_never_raise(chunks):
    state = RigState("userspace", ALL)
    buffer = LineBuffer()
    for chunk in chunks:
        for item in buffer.feed(chunk):
            action = state.handle(item)
            if action is None:
                assert isinstance(item, str) and not item.strip()
            elif isinstance(action, Reply):
                assert action.line.startswith("ERR ") and "\n" not in action.line
            else:
                assert isinstance(action, (Apply, Status))


@pytest.mark.parametrize("length", [1, 6, 127, 128])
def test_a_line_of_the_longest_allowed_length_passes_however_its_bytes_are_split(length: int) -> None:
    """A 128-byte command whose CR and LF arrive in separate reads is still one command (the CR waiting for
    its LF does not count against the limit)."""
    line = (b"STATUS " + b"X" * 200)[:length]
    wire = line + b"\r\n"
    for cut in range(len(wire) + 1):
        buffer = LineBuffer()
        assert [*buffer.feed(wire[:cut]), *buffer.feed(wire[cut:])] == [line.decode()], cut


@pytest.mark.parametrize(
    ("line", "reply", "loss"),
    [
        ("LOSS 99.99999999999", "ERR", None),  # rounds to 100 at the bridge's 1e-7 % resolution: all frames
        ("LOSS 0.00000001", "OK LOSS 0", "0"),  # below the resolution: nothing is dropped, and STATUS says so
        ("LOSS 12.3456789", "OK LOSS 12.3456789", "12.3456789"),
        ("LOSS 99.9999999", "OK LOSS 99.9999999", "99.9999999"),
    ],
)
def test_the_loss_a_reply_and_status_state_is_the_loss_in_force(line, reply, loss):
    """Issue 26 "STATUS never lies": ``LOSS 99.99999999999`` was answered ``OK LOSS 100`` (a value LOSS
    refuses) and the bridge's rule dropped every frame while STATUS said ``up=1``."""
    state = RigState("bridge", frozenset(FEATURES))
    action = state.handle(line)
    if isinstance(action, Apply):
        state.commit(action.settings)
        assert drop_rules("t", "bridge", ["forward"], ["lan0"], action.settings).count("numgen") == (loss != "0")
    assert getattr(action, "line", "").startswith(reply), action
    status = state.status_line({})
    assert (f" loss={loss} " in status) if loss is not None else " loss=0 " in status, status
