"""HLC text form (zero padded, as the SDKs), ordering, and the paper's send/receive rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.statestore.hlc import Hlc, HlcFormatError, HybridClock


def test_text_form_is_zero_padded() -> None:
    assert str(Hlc(1696374425000, 1, "StateStore")) == "001696374425000:00001:StateStore"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1696374425000:0:Client1", Hlc(1696374425000, 0, "Client1")),  # the protocol document's unpadded form
        ("001696374425000:00001:StateStore", Hlc(1696374425000, 1, "StateStore")),
        ("1:2:node:with:colons", Hlc(1, 2, "node:with:colons")),
    ],
)
def test_parse(text: str, expected: Hlc) -> None:
    assert Hlc.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["", "1:2", "1:2:", "a:2:n", "1:-2:n", "-1:2:n", " 1:2:n", "1.5:2:n", "1:2.0:n", "1234567890123456789:0:n", "１:2:n"]
)
def test_parse_rejects_malformed(text: str) -> None:
    with pytest.raises(HlcFormatError):
        Hlc.parse(text)


def test_order_is_wall_then_counter_then_node() -> None:
    assert Hlc(1, 9, "z") < Hlc(2, 0, "a")
    assert Hlc(1, 1, "z") < Hlc(1, 2, "a")
    assert Hlc(1, 1, "a") < Hlc(1, 1, "b")


def test_receive_matches_the_protocol_example() -> None:
    clock = HybridClock("StateStore")
    request = Hlc.parse("1696374425000:0:Client1")
    assert str(clock.receive(request, 1696374425000)) == "001696374425000:00001:StateStore"


def test_receive_from_the_past_takes_the_local_clock() -> None:
    clock = HybridClock("S")
    assert clock.receive(Hlc(1000, 7, "c"), 5000) == Hlc(5000, 0, "S")


def test_receive_from_the_future_follows_the_remote_wall_clock() -> None:
    clock = HybridClock("S")
    assert clock.receive(Hlc(9000, 3, "c"), 5000) == Hlc(9000, 4, "S")
    assert clock.receive(Hlc(9000, 1, "c"), 5001) == Hlc(9000, 5, "S")


def test_tick_does_not_go_backwards_when_the_wall_clock_does() -> None:
    clock = HybridClock("S")
    first = clock.tick(5000)
    second = clock.tick(4000)
    assert second > first and second.wall_ms == 5000


def test_advance_to_resumes_above_a_persisted_value() -> None:
    clock = HybridClock("S")
    clock.advance_to(Hlc(7000, 3, "S"))
    assert clock.tick(1000) == Hlc(7000, 4, "S")


stamps = st.builds(Hlc, st.integers(0, 10**13), st.integers(0, 10**5), st.text(min_size=1, max_size=5).filter(lambda s: s.isprintable()))


@given(st.lists(st.tuples(stamps, st.integers(0, 10**13), st.booleans()), max_size=30))
def test_every_issued_value_is_greater_than_the_last_and_than_the_received_one(
    events: list[tuple[Hlc, int, bool]]
) -> None:
    clock = HybridClock("S")
    previous = clock.last
    for remote, physical, is_receive in events:
        issued = clock.receive(remote, physical) if is_receive else clock.tick(physical)
        assert (issued.wall_ms, issued.counter) > (previous.wall_ms, previous.counter)
        assert issued.wall_ms >= physical
        if is_receive:
            assert issued > remote
        previous = issued


@given(stamps)
def test_text_round_trip(stamp: Hlc) -> None:
    assert Hlc.parse(str(stamp)) == stamp
