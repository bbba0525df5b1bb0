"""The PUBLISHes of one upstream batch: what each carried, which are answered, and what that means.

Rules
-----
* PUBLISHes are answered in the order they were handed out (MQTT 5 section 4.6: a server sends PUBACKs
  in the order it received the PUBLISHes), so an answer is always for the oldest one unanswered.
* A message counts as done only once the PUBACK of the PUBLISH that carried it is in; a refused PUBLISH
  (a PUBACK with a failure reason code) names its messages as refused, and its answer still counts as a
  time the link carried something (the window's measurements).
* An expired message skipped before a PUBLISH is done with that PUBLISH's PUBACK (the pump may take it
  off its queue then, not before: the queue's checkpoint is a prefix); expired messages at the end of a
  batch that ran to its end are done with the batch.
* A lost connection names the messages of every PUBLISH not answered yet: the pump sends those again.

Theory of operation
-------------------
``UpstreamSender.send`` (``upstream.py``) hands out PUBLISHes and awaits their PUBACKs; this class keeps
the books of one such batch, so that what the pump is told (``acked``, ``refused``, ``in_flight_seqs``,
``done``) and what the link estimate is fed (``sizes``, ``ack_times``) are one state with its own tests.
Pure: no I/O and no clock; the caller passes the times.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the queue's module brings SQLite and asyncio, which this state needs not
    from appliance.forwarding.queues import QueuedMessage


class BatchInFlight:
    """One batch's PUBLISHes, handed out from ``sent_at`` (monotonic seconds), and their answers."""

    def __init__(self, sent_at: float) -> None:
        self.sent_at = sent_at
        #: Per PUBLISH handed out, in order: its size on the wire and the live messages it carried.
        self.sizes: list[int] = []
        self.published: list[list[QueuedMessage]] = []
        #: When each answered PUBLISH's answer came (a prefix of ``published``).
        self.ack_times: list[float] = []
        #: Sequence numbers of the messages acknowledged, in the order their PUBACKs came; of those refused.
        self.acked: list[int] = []
        self.refused: list[int] = []
        #: The first refusal's reason ("" while none).
        self.refusal = ""
        self._completes: list[int] = []  # messages of the batch each PUBLISH's PUBACK completes
        self._expired_run = 0  # expired messages skipped since the last PUBLISH handed out
        self._acked_bytes = 0

    @property
    def unanswered(self) -> int:
        """PUBLISHes handed out and not answered yet."""
        return len(self.published) - len(self.ack_times)

    def skipped_expired(self, count: int) -> None:
        """``count`` messages of the batch expired before their turn: they go on no PUBLISH."""
        self._expired_run += count

    def handed_out(self, live: list[QueuedMessage], covers: int, size: int) -> None:
        """A PUBLISH of ``live`` (``size`` bytes on the wire) went to the link; ``covers``: the messages of
        the batch its group held, expired ones included."""
        self.published.append(live)
        self.sizes.append(size)
        self._completes.append(self._expired_run + covers)
        self._expired_run = 0

    def answered(self, at: float, refusal: str | None = None) -> None:
        """The oldest unanswered PUBLISH got its PUBACK at ``at``: accepted, or refused for ``refusal``."""
        index = len(self.ack_times)
        items = self.published[index]
        self.ack_times.append(at)
        if refusal is None:
            self.acked.extend(item.seq for item in items)
            self._acked_bytes += sum(item.size for item in items)
        else:
            self.refused.extend(item.seq for item in items)
            self.refusal = self.refusal or refusal

    def answered_sizes(self) -> list[int]:
        """The sizes of the PUBLISHes answered so far (beside ``ack_times``)."""
        return self.sizes[: len(self.ack_times)]

    def in_flight_seqs(self) -> list[int]:
        """The messages of every PUBLISH not answered yet (a lost connection: they go again)."""
        return [item.seq for items in self.published[len(self.ack_times):] for item in items]

    def acked_bytes(self) -> int:
        """Payload bytes of the messages acknowledged."""
        return self._acked_bytes

    def done(self, finished: bool) -> int:
        """How many messages of the batch (a prefix) are done once every PUBLISH is answered; ``finished``:
        the batch ran to its end (not preempted, nothing refused), so expired messages after the last
        PUBLISH are done too."""
        return sum(self._completes) + (self._expired_run if finished else 0)
