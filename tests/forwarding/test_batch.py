"""The upstream batch format: round trips, its size on the wire, and malformed input."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.forwarding.batch import (
    BatchFormatError,
    decode_batch,
    encode_batch,
    record_properties,
    source_of,
)
from appliance.forwarding.endpoints import identity_properties
from appliance.forwarding.messages import Message
from appliance.forwarding.queues import QueuedMessage
from testing.campaigns import campaign

texts = st.text(max_size=12)
optional_texts = st.one_of(st.none(), st.text(min_size=1, max_size=12))


@st.composite
def queued(draw: st.DrawFn) -> list[QueuedMessage]:
    count = draw(st.integers(0, 20))
    seqs = sorted(draw(st.sets(st.integers(1, 2**40), min_size=count, max_size=count)))
    devices = draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3))
    items = []
    for seq in seqs:
        message = Message(
            "/messages/events", "t", draw(st.binary(max_size=300)), draw(st.sampled_from(devices)),
            draw(optional_texts), draw(optional_texts), draw(st.lists(st.tuples(texts, texts), max_size=3)),
            draw(optional_texts), draw(optional_texts), draw(optional_texts),
        )
        enqueued = draw(st.integers(0, 2**43))
        ttl = draw(st.integers(0, 10**6))
        items.append(QueuedMessage(seq, "upstream", 3, enqueued, ttl, enqueued + ttl * 1000, message))
    return items


@campaign(300, deadline=None)
@given(items=queued(), sent_ms=st.integers(0, 2**43), priority=st.integers(0, 10))
def test_every_field_survives_a_round_trip(items: list[QueuedMessage], sent_ms: int, priority: int) -> None:
    batch = decode_batch(encode_batch("gw-7", priority, sent_ms, items))
    assert (batch.gateway_id, batch.priority, batch.sent_ms) == ("gw-7", priority, sent_ms)
    assert len(batch.records) == len(items)
    for record, item in zip(batch.records, items, strict=True):
        assert record.message_id == f"gw-7:{item.seq}"
        assert (record.seq, record.enqueued_ms, record.payload) == (item.seq, item.enqueued_ms, item.message.payload)
        assert record.source == source_of(item)
        assert record.device_message_id == item.message.message_id


def reading(seq: int, device: str = "t01", enqueued_ms: int = 1_790_000_000_000) -> QueuedMessage:
    message = Message("/messages/events", f"devices/{device}/messages/events/data", b"x" * 200, device, None, "data",
                      [("unit", "C")], "application/json")
    return QueuedMessage(seq, "upstream", 9, enqueued_ms, 7200, enqueued_ms + 7_200_000, message)


def test_a_message_costs_a_few_bytes_beyond_its_payload() -> None:
    """The point of the format: ten 200-byte readings from two devices in under 2.2 kB, not ~4.6 kB."""
    items = [reading(100_000 + n, f"t{n % 2:02d}", 1_790_000_000_000 + n) for n in range(10)]
    encoded = encode_batch("gw1", 9, 1_790_000_000_500, items)
    per_message = (len(encoded) - 2 * 50) / 10 - 200
    assert per_message <= 6, per_message
    assert len(encoded) < 2200


def test_a_record_has_the_user_properties_of_its_one_message_publish() -> None:
    """``record_properties`` rebuilds exactly what the one-message format sends (``identity_properties``)."""
    items = [reading(5, "t01"), reading(8, "t02")]
    batch = decode_batch(encode_batch("gw1", 9, 1234, items))
    for record, item in zip(batch.records, items, strict=True):
        assert record_properties(batch, record) == identity_properties(item, "gw1", 1234)


def test_sources_are_listed_once() -> None:
    items = [reading(n + 1, f"t{n % 3}") for n in range(9)]
    batch = decode_batch(encode_batch("gw1", 9, 0, items))
    assert len({id(record.source) for record in batch.records}) == 3


def test_enqueue_times_may_go_backwards_when_the_clock_did() -> None:
    items = [reading(1, enqueued_ms=5000), reading(2, enqueued_ms=4000), reading(3, enqueued_ms=4500)]
    assert [r.enqueued_ms for r in decode_batch(encode_batch("gw1", 0, 0, items)).records] == [5000, 4000, 4500]


def test_sequence_numbers_must_increase() -> None:
    with pytest.raises(ValueError, match="must increase"):
        encode_batch("gw1", 0, 0, [reading(5), reading(5)])


VALID = encode_batch("gw1", 2, 1234, [reading(7), reading(9, "t02")])


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "no 'GB' magic"),
        (b"{\"json\": 1}", "no 'GB' magic"),
        (b"GB", "truncated version at byte 2"),
        (b"GB\x02" + VALID[3:], "unsupported batch version 2"),
        (b"GB\x01\x00", "empty gateway id"),
        (b"GB\x01\x03gw", "gateway id of 3 bytes runs past the end"),
        (b"GB\x01\x02\xff\xfe", "gateway id is not UTF-8 at byte 3"),
        (VALID[:-1], "record 1 payload of 200 bytes runs past the end"),
        (VALID + b"\x00", "1 bytes after the last record"),
        (b"GB\x01\x02gw\x00\x00\x00\x01\x00", "record 0 names source 0 of 0"),
        (b"GB\x01\x02gw\x00\x00" + b"\xff" * 11, "source count longer than 64 bits"),
    ],
)
def test_malformed_batches_are_rejected_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(BatchFormatError, match=reason):
        decode_batch(data)


def test_a_repeated_sequence_number_is_rejected() -> None:
    one = encode_batch("gw1", 0, 0, [reading(3)])
    header, record = one[: one.index(b"\x01\x00\x03", 3)], one[one.index(b"\x01\x00\x03", 3) + 1 :]
    # Two records: the second with a sequence delta of 0.
    twice = header + b"\x02" + record + record[:1] + b"\x00" + record[2:]
    with pytest.raises(BatchFormatError, match="record 1 repeats sequence number 3"):
        decode_batch(twice)


@campaign(500, deadline=None)
@given(st.binary(max_size=200), st.integers(0, len(VALID)))
def test_garbage_only_ever_raises_batch_format_error(noise: bytes, cut: int) -> None:
    for data in (noise, VALID[:cut] + noise, b"GB\x01" + noise):
        with contextlib.suppress(BatchFormatError):
            decode_batch(data)
