"""A broker core and fake clients that speak bytes, on a fake clock: h11's ``ConnectionPair`` for MQTT.

``BrokerPair`` builds the real ``Broker`` (real codec, sessions, router, store) with ``FakeRuntime`` as
its clock and scheduler. ``FakeClient`` is the socket layer's side of one connection: ``send`` feeds
encoded packets to ``Broker.data_received`` and runs what became ready; what the broker writes is parsed
back with the codec's reader. Nothing opens a socket and nothing waits: ``advance(seconds)`` moves the
clock and fires the timers that fall due on the way, in order, so a 30 s keep-alive takes microseconds.

The fake runtime (``testing/fake_runtime.py``, shared by every layer) drives coroutines itself
(``spawn``): they may await ``sleep``, ``run_blocking`` and each other, which is all the broker core
awaits when it has no services.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from appliance.broker.broker import Broker
from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.writer import encode
from appliance.broker.config import BrokerConfig, LimitsConfig, ListenerConfig
from appliance.broker.persistence.store import BrokerStore
from appliance.broker.security.acl import Acl
from appliance.broker.security.auth import Authenticator
from appliance.broker.sessions.session import ClientConnection
from testing.fake_runtime import FakeRuntime

T = TypeVar("T")


class FakeClient:
    """One client connection as the socket layer would present it (``transport.link.Link``)."""

    def __init__(self, pair: BrokerPair, level: int, name: str) -> None:
        self.pair = pair
        self.level = level
        limits = pair.broker.limits
        self.connection = ClientConnection(limits.max_packet_size, limits.topic_alias_maximum, name)
        self.connection.link = self
        self.reader = PacketReader(protocol_level=level)
        self.inbox: list[pk.Packet] = []
        self.raw = bytearray()
        self.holds: set[str] = set()
        self.closed = False
        #: The client closed its socket but the broker, not reading, has not noticed (``peer_closed``).
        self.left_unnoticed = False
        #: Bytes the client sent wait unread in its socket (the broker holds its reading; ``send`` hands
        #: bytes to the broker whatever the holds, so a test says this itself).
        self.unread = False
        self.writes_after_close = 0
        #: Calls of ``write`` (the broker writes a connection's bytes of one flush in one call).
        self.writes = 0
        pair.broker.connection_made(self)

    # -- the Link side (called by the broker) ----------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.closed:
            self.writes_after_close += 1
            return
        self.writes += 1
        self.raw += data
        self.inbox += self.reader.feed(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pair.runtime.call_soon(self.pair.broker.connection_lost, self)

    def hold_reading(self, reason: str, held: bool) -> None:
        if held:
            self.holds.add(reason)
        else:
            self.holds.discard(reason)

    def peer_closed(self) -> bool:
        return self.closed or self.left_unnoticed

    def unread_input(self) -> bool:
        return self.unread and not self.peer_closed()

    # -- the test's side -------------------------------------------------------------------------------

    def send(self, *packets: pk.Packet | bytes) -> None:
        """Send ``packets`` in ONE read (as one TCP segment would arrive) and run what became ready."""
        self.arrive(*packets)
        self.pair.runtime.run()

    def arrive(self, *packets: pk.Packet | bytes) -> None:
        """Like ``send``, but run nothing that became ready: the test steps the loop (``FakeRuntime.step``)."""
        data = b"".join(p if isinstance(p, bytes) else encode(p, self.level) for p in packets)
        self.pair.broker.data_received(self, data)

    def received(self) -> list[pk.Packet]:
        """Every packet that arrived since the last call."""
        packets, self.inbox = self.inbox, []
        return packets

    def expect(self, kind: type[T]) -> T:
        packets = self.received()
        assert len(packets) == 1 and isinstance(packets[0], kind), f"expected one {kind.__name__}, got {packets!r}"
        return packets[0]

    def connect(self, client_id: str, clean_start: bool = True, keep_alive: int = 0, **kwargs: Any) -> pk.Connack:
        self.send(pk.Connect(self.level, client_id, clean_start, keep_alive, **kwargs))
        return self.expect(pk.Connack)

    def subscribe(self, topic_filter: str, qos: int = 0, packet_id: int = 1) -> pk.Suback:
        self.send(pk.Subscribe(packet_id, [pk.SubscribeRequest(topic_filter, qos)]))
        return self.expect(pk.Suback)

    def drop(self) -> None:
        """The network connection breaks (no DISCONNECT)."""
        self.closed = True
        self.pair.broker.connection_lost(self)
        self.pair.runtime.run()

    def congest(self, congested: bool) -> None:
        """The socket layer's flow control: the write buffer went over (or back under) its high-water mark."""
        self.connection.congested = congested
        if not congested:
            self.connection.overloaded = False
        self.pair.broker.congestion_changed(self, congested)
        self.pair.runtime.run()


class BrokerPair:
    """``Broker`` + ``FakeRuntime`` + as many ``FakeClient``s as a test opens."""

    def __init__(self, data_dir: Path | None = None, acl: Acl | None = None,
                 authenticator: Authenticator | None = None, clock_start: float = 0.0, **limits: Any) -> None:
        """``clock_start``: seconds after ``WALL_CLOCK_START`` at which this broker's clock starts."""
        self._rebuild = (data_dir, acl, authenticator, limits)
        self.runtime = FakeRuntime(clock_start)
        self.store = BrokerStore.open(data_dir / "broker.db") if data_dir is not None else None
        config = BrokerConfig((ListenerConfig("tcp", "fake", 0),), limits=LimitsConfig(**{"sys_interval": 0, **limits}))
        self.broker = Broker(config, self.store, authenticator or Authenticator(None, True), acl, runtime=self.runtime)
        self.runtime.complete(self.broker.start())
        self._names = itertools.count(1)

    def client(self, level: int = pk.MQTT_5) -> FakeClient:
        return FakeClient(self, level, f"fake:{next(self._names)}")

    def connected(self, client_id: str, level: int = pk.MQTT_5, **connect: Any) -> FakeClient:
        """A client that has connected as ``client_id`` (``connect``: the rest of its CONNECT)."""
        client = self.client(level)
        client.connect(client_id, **connect)
        return client

    def advance(self, seconds: float) -> None:
        self.runtime.advance(seconds)

    def count_clock_reads(self) -> dict[str, int]:
        """From now on, count the broker's reads of the clock: the returned dict's ``now`` and
        ``monotonic`` go up with each (a batch of packets reads each once, ``context.read_clock``)."""
        counts = {"now": 0, "monotonic": 0}
        for name in counts:
            read = getattr(self.runtime, name)

            def counted(name: str = name, read: Callable[[], float] = read) -> float:
                counts[name] += 1
                return read()

            setattr(self.runtime, name, counted)
        return counts

    def killed(self, down_for: float) -> BrokerPair:
        """kill -9 and a restart ``down_for`` seconds later: this broker stops running where it is (no
        shutdown, no wills, its timers never fire, what it did not commit is lost with its database
        connection) and a new one starts on the same data dir, its clock that much later."""
        data_dir, acl, authenticator, limits = self._rebuild
        assert data_dir is not None, "a broker without a data dir has nothing to restart from"
        if self.store is not None:
            self.store.close()
        return BrokerPair(data_dir, acl, authenticator, clock_start=self.runtime.time + down_for, **limits)

    def stop(self) -> None:
        self.runtime.complete(self.broker.stop())
        if self.store is not None:
            self.store.close()


def subscriber_and_publisher(pair: BrokerPair, level: int, qos: int, **session: Any) -> tuple[FakeClient, FakeClient]:
    """``sub`` subscribed to ``t`` at ``qos`` (its CONNECT given ``session``), and ``pub``, both connected."""
    subscriber = pair.connected("sub", level, **session)
    subscriber.subscribe("t", qos)
    return subscriber, pair.connected("pub", level)


def closed_after_one_and_a_half_keep_alives(pair: BrokerPair, client: FakeClient, keep_alive: int, level: int) -> None:
    """``client``, silent from now on, is open until just before 1.5 ``keep_alive`` and closed just after:
    with DISCONNECT 0x8D on MQTT 5, with nothing on 3.1.1 (which has no server DISCONNECT)."""
    pair.advance(keep_alive * 1.5 - 0.1)
    assert not client.closed
    pair.advance(0.2)
    assert client.closed
    received = client.received()
    if level == pk.MQTT_5:
        [disconnect] = received
        assert isinstance(disconnect, pk.Disconnect) and disconnect.reason_code == rc.KEEP_ALIVE_TIMEOUT
    else:
        assert received == []
