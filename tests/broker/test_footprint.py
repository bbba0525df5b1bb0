"""What the broker core keeps per idle connected client, counted by tracemalloc: a bound that a per-connection
allocation added by mistake (a deque, a set, a dict per session) goes over.

The figure is deterministic for a given Python: the same packets build the same objects. It covers what
the core allocates for a client that connected (MQTT 5, keep-alive 60 s, no subscription) and then says
nothing: its ``ClientConnection`` (made by the socket layer in production, here by ``IdleLink``), reader,
``Session``, the broker's tables and its keep-alive entry.
The socket layer's share and the resident memory of a real gateway are measured from outside by
``bench/idle_connections.py`` (bench/RESULTS.md). Measured on Python 3.11 when the bound was set: 1,374
bytes per client; 1,502 with a runtime timer per connection for its keep-alive, 2,486 while sessions also
made a deque and a set each (issue 30).
"""

from __future__ import annotations

import gc
import tracemalloc

from appliance.broker.codec import packets as pk
from appliance.broker.codec.writer import encode
from appliance.broker.sessions.session import ClientConnection
from tests.broker.pair import BrokerPair

#: Bytes the core may keep per idle MQTT 5 client.
IDLE_CLIENT_BYTES = 1_550
CLIENTS = 2_000


class IdleLink:
    """The socket layer's side of an idle connection, as small as it can be so the count is the core's."""

    __slots__ = ("connection", "written", "closed")

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection
        self.written = 0
        self.closed = False
        connection.link = self

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def close(self) -> None:
        self.closed = True

    def hold_reading(self, reason: str, held: bool) -> None:
        raise AssertionError(f"an idle client's reading was held ({reason})")

    def peer_closed(self) -> bool:
        return False

    def unread_input(self) -> bool:
        return False


def connect_idle(pair: BrokerPair, connects: list[bytes]) -> list[IdleLink]:
    broker = pair.broker
    limits = broker.limits
    links = []
    for connect in connects:
        link = IdleLink(ClientConnection(limits.max_packet_size, limits.topic_alias_maximum, "127.0.0.1:50000"))
        broker.connection_made(link)
        broker.data_received(link, connect)
        links.append(link)
    pair.runtime.run()
    assert all(link.connection.session is not None for link in links)
    return links


def test_an_idle_mqtt5_client_costs_the_core_a_bounded_number_of_bytes() -> None:
    pair = BrokerPair()
    try:
        connects = [encode(pk.Connect(pk.MQTT_5, f"idle-{index:05d}", keep_alive=60), pk.MQTT_5)
                    for index in range(2 * CLIENTS)]
        connect_idle(pair, connects[:CLIENTS])  # warm up: tables grown once, caches filled
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            links = connect_idle(pair, connects[CLIENTS:])
            gc.collect()
            per_client = (tracemalloc.get_traced_memory()[0] - before) / CLIENTS
        finally:
            tracemalloc.stop()
        assert all(link.written and not link.closed for link in links)  # every one got its CONNACK and stays
        assert per_client <= IDLE_CLIENT_BYTES, f"{per_client:,.0f} bytes per idle client"
    finally:
        pair.stop()
