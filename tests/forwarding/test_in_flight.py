"""The books of one upstream batch in flight (appliance/forwarding/in_flight.py), on the fake clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from appliance.forwarding.in_flight import BatchInFlight
from appliance.forwarding.messages import Message
from appliance.forwarding.queues import QueuedMessage
from testing.campaigns import campaign
from testing.fake_runtime import FakeRuntime


def item(seq: int, size: int = 100) -> QueuedMessage:
    message = Message("/messages/events", "t", b"x" * size, "d1", None, None, [], None)
    return QueuedMessage(seq, "upstream", 9, 0, 60, 60_000, message)


def test_answers_complete_publishes_in_order_and_feed_the_estimate_their_times() -> None:
    runtime = FakeRuntime()
    books = BatchInFlight(runtime.monotonic())
    books.handed_out([item(1)], 1, 130)
    books.handed_out([item(2), item(3)], 2, 260)
    assert books.unanswered == 2 and books.in_flight_seqs() == [1, 2, 3]
    runtime.advance(0.4)
    books.answered(runtime.monotonic())
    assert (books.acked, books.answered_sizes(), books.ack_times) == ([1], [130], [0.4])
    assert books.in_flight_seqs() == [2, 3], "a lost connection now sends only the unanswered again"
    runtime.advance(0.2)
    books.answered(runtime.monotonic())
    assert books.unanswered == 0 and books.acked == [1, 2, 3] and books.acked_bytes() == 300
    assert books.done(finished=True) == 3


def test_a_refusal_names_only_its_messages_and_still_counts_as_an_answer() -> None:
    runtime = FakeRuntime()
    books = BatchInFlight(runtime.monotonic())
    for seq in (1, 2, 3):
        books.handed_out([item(seq)], 1, 130)
    runtime.advance(0.1)
    books.answered(runtime.monotonic())
    books.answered(runtime.monotonic(), "Quota exceeded (0x97)")
    books.answered(runtime.monotonic(), "Not authorized (0x87)")
    assert books.acked == [1] and books.refused == [2, 3]
    assert books.refusal == "Quota exceeded (0x97)", "the first refusal is the one reported"
    assert books.acked_bytes() == 100, "refused bytes were not sent"
    assert len(books.ack_times) == 3


def test_expired_messages_are_done_with_the_next_publish_or_with_a_finished_batch() -> None:
    """The pump takes a prefix off its queue: messages skipped as expired are done only with the PUBACK of
    the PUBLISH after them, and those after the last PUBLISH only if the batch ran to its end."""
    books = BatchInFlight(0.0)
    books.skipped_expired(2)
    books.handed_out([item(3)], 1, 130)
    books.skipped_expired(1)
    books.handed_out([item(5)], 2, 130)  # its group held 2 messages, one of them expired
    books.skipped_expired(4)
    books.answered(1.0)
    books.answered(1.1)
    assert books.done(finished=False) == 6
    assert books.done(finished=True) == 10


@campaign(200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.booleans()), max_size=30), st.data())
def test_every_message_is_exactly_one_of_acked_refused_in_flight_or_expired(
        groups: list[tuple[int, int, bool]], data: st.DataObject) -> None:
    """Any batch: expired runs, PUBLISHes of 1-3 messages, answered (accepted or refused) up to any point."""
    books = BatchInFlight(0.0)
    seq = 0
    expired = 0
    outcomes: list[bool] = []
    for skipped, live, accepted in groups:
        books.skipped_expired(skipped)
        expired += skipped
        items = [item(seq + n) for n in range(live)]
        seq += live
        books.handed_out(items, live, 100 * live)
        outcomes.append(accepted)
    answered = data.draw(st.integers(0, len(outcomes)))
    for index in range(answered):
        books.answered(float(index), None if outcomes[index] else "refused")
    every = sorted(books.acked + books.refused + books.in_flight_seqs())
    assert every == list(range(seq))
    assert books.unanswered == len(outcomes) - answered
    assert books.acked_bytes() == 100 * len(books.acked)
    if answered == len(outcomes):
        assert books.done(finished=True) == seq + expired
