"""What a handler is given: the broker state it may read and change, the output port, and the clock
reading of its batch.

Rules:

* A handler (``handlers/``), the lifecycle of connections and sessions (``sessions/lifecycle``), the
  mapping to the store (``persistence/storage``, ``persistence/store_failure``) and the retained feeds
  (``routing/retained_feed``) see the broker only as a ``HandlerContext``: the members listed here, and
  nothing else. mosquitto's ``handle__*(context)`` reads a global ``db`` for the rest; here the rest does
  not exist for them, and mypy checks it.
* What leaves a handler goes through ``Output``: bytes queued on a connection (``mark``), a connection to
  close once its bytes are written (``close_after_flush``), a message to route. The handler never writes
  to a socket or commits; the core does both, commit first, once per loop turn.
* Time is an input: the core reads the clock once per batch of packets as one ``Instant`` (wall-clock
  and monotonic seconds) and hands it to every handler of the batch. Only a continuation after an await
  (a password check, a service's ``on_publish``) is a new batch and reads the clock again
  (``read_clock``).

Theory of operation: this module sits below everything that takes a context and above the parts the
context is made of, so imports point one way (``tests/broker/test_import_cycles.py``). The members whose
types live above it (the commit gate, the retained feeds) are named here by the small ports the handlers
use (``CommitPort``, ``RetainedFeedPort``). ``broker.Broker`` satisfies every protocol here structurally:
no adapter object and no extra call on the per-message path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import NamedTuple, Protocol

from appliance.broker.api import BrokerService
from appliance.broker.config import LimitsConfig
from appliance.broker.persistence.store import BrokerStore
from appliance.broker.routing.message import BrokerMessage
from appliance.broker.routing.retain import RetainedMessages
from appliance.broker.routing.router import Router
from appliance.broker.routing.topic_tree import SubscriptionOptions, SubscriptionTree
from appliance.broker.security.acl import Acl
from appliance.broker.security.auth import Authenticator
from appliance.broker.security.login_gate import LoginGate
from appliance.broker.sessions.backpressure import Backpressure
from appliance.broker.sessions.keepalive import KeepAlive
from appliance.broker.sessions.session import ClientConnection, Session
from appliance.broker.sessions.will import PendingWills
from appliance.broker.sys_topics import BrokerStats
from appliance.broker.transport.link import Link
from appliance.runtime import Runtime
from appliance.store_health import StoreHealth


class Instant(NamedTuple):
    """One reading of the clock for a whole batch: ``wall`` (seconds since the epoch: expiry, wills,
    ``$SYS``) and ``monotonic`` (seconds: keep-alive, login and takeover rates)."""

    wall: float
    monotonic: float


#: ``tuple.__new__``: builds an ``Instant`` in C (a NamedTuple's own constructor is a Python function).
_new_instant = tuple.__new__


def read_clock(runtime: Runtime) -> Instant:
    """The one way the broker reads the time for a batch (once per read: no Python frame below this one
    with the production runtime, whose clocks are the C functions themselves)."""
    return _new_instant(Instant, (runtime.now(), runtime.monotonic()))


class Output(Protocol):
    """Where what a handler produces goes; the core writes and commits it, never the handler."""

    def mark(self, connection: ClientConnection) -> None:
        """``connection.out`` has bytes: write them in the next flush (after the commit)."""

    def schedule_flush(self) -> None:
        """Flush at the end of this loop turn even if no connection was marked."""

    def flush(self) -> None:
        """Commit, then write every marked connection now."""

    def close_after_flush(self, link: Link) -> None:
        """Write what ``link``'s connection has pending (after the commit), then close it."""

    def route(self, message: BrokerMessage, now: float, publisher: Link | None = None) -> bool:
        """Deliver ``message`` to every matching session; False if a QoS 1/2 delivery was dropped."""


class CommitPort(Protocol):
    """The part of the commit gate a handler uses: an acknowledgement that waits on this turn's commit."""

    def revision(self) -> int: ...

    def hold(self, connection: ClientConnection, revision: int, start: int) -> None: ...


class RetainedFeedPort(Protocol):
    """The retained messages a new subscription gets, handed over a slice per loop turn."""

    def start(self, session: Session, topic_filter: str, options: SubscriptionOptions, now: float) -> None: ...

    def cancel(self, client_id: str, topic_filter: str) -> None: ...


class HandlerContext(Output, Protocol):
    """The broker state the handlers read and change (see the module docstring)."""

    # -- configuration and the ports to the outside --
    @property
    def limits(self) -> LimitsConfig: ...
    @property
    def runtime(self) -> Runtime: ...
    @property
    def services(self) -> list[BrokerService]: ...
    @property
    def service_filters(self) -> list[tuple[str, BrokerService]]: ...
    @property
    def service_cache(self) -> dict[str, tuple[BrokerService, ...]]: ...
    @property
    def queue_bytes_limit(self) -> int: ...

    # -- security --
    @property
    def authenticator(self) -> Authenticator: ...
    @property
    def acl(self) -> Acl | None: ...
    @property
    def login_gate(self) -> LoginGate: ...
    @property
    def takeovers(self) -> dict[str, deque[float]]: ...

    def receive_check(self) -> Callable[[Session, str], bool] | None: ...

    def may_receive(self, session: Session, topic: str) -> bool: ...

    # -- sessions, connections, routing --
    @property
    def sessions(self) -> dict[str, Session]: ...
    @property
    def links(self) -> set[Link]: ...
    @property
    def tree(self) -> SubscriptionTree: ...
    @property
    def router(self) -> Router: ...
    @property
    def retained(self) -> RetainedMessages: ...
    @property
    def retained_feeds(self) -> RetainedFeedPort: ...
    @property
    def wills(self) -> PendingWills: ...
    @property
    def keepalive(self) -> KeepAlive: ...
    @property
    def backpressure(self) -> Backpressure: ...
    @property
    def stats(self) -> BrokerStats: ...

    # -- the store --
    @property
    def store(self) -> BrokerStore | None: ...
    @property
    def commits(self) -> CommitPort: ...
    @property
    def store_health(self) -> StoreHealth: ...

    #: The last commit failed: requests that need a write are refused (set by the commit gate).
    store_failing: bool
    #: When ``$SYS`` was last published; 0 asks for it at the next tick.
    last_sys: float
