"""The protocol state of one network connection, without I/O: what a connection has agreed.

``ClientConnection`` lives as long as one network connection: the reader, the negotiated limits (the client's
Receive Maximum, Maximum Packet Size and Topic Alias Maximum), topic aliases both ways, keep-alive
bookkeeping, and ``out``, the bytes waiting to be written. It never touches a socket: the server feeds it
bytes and writes ``out`` once per loop turn.

``ALLOWED_PACKETS`` is the connection's state table: which packet types a client may send in each state.
Anything else is a protocol error, mapped to a reason code by the caller in one place.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from appliance.broker.codec import packets as pk
from appliance.broker.codec.properties import TOPIC_ALIAS
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.reasons import (
    PROTOCOL_ERROR,
    TOPIC_ALIAS_INVALID,
    TOPIC_NAME_INVALID,
    MqttProtocolError,
)

#: What a connection has attached once CONNECT is accepted (``session.Session``: this layer sits below
#: sessions and does not import them; ``session.ClientConnection`` is this class with its ``Session``).
SessionT = TypeVar("SessionT")

AWAITING_CONNECT, AUTHENTICATING, CONNECTED, CLOSED = "awaiting-connect", "authenticating", "connected", "closed"

#: State table: the packet types a client may send in each connection state. AUTHENTICATING (the CONNECT
#: is being checked in an executor) buffers packets instead of handling them, so it allows them all.
ALLOWED_PACKETS: dict[str, frozenset[int]] = {
    AWAITING_CONNECT: frozenset({pk.CONNECT}),
    AUTHENTICATING: frozenset(
        {pk.PUBLISH, pk.PUBACK, pk.PUBREC, pk.PUBREL, pk.PUBCOMP, pk.SUBSCRIBE, pk.UNSUBSCRIBE, pk.PINGREQ,
         pk.DISCONNECT, pk.AUTH}
    ),
    CONNECTED: frozenset(
        {pk.PUBLISH, pk.PUBACK, pk.PUBREC, pk.PUBREL, pk.PUBCOMP, pk.SUBSCRIBE, pk.UNSUBSCRIBE, pk.PINGREQ,
         pk.DISCONNECT, pk.AUTH}
    ),
    CLOSED: frozenset(),
}


class ClientConnection(Generic[SessionT]):
    """The protocol state of one network connection (see the module docstring)."""

    __slots__ = (
        "reader", "out", "state", "protocol_level", "v5", "client_id", "username", "keep_alive", "last_received",
        "send_quota", "max_outbound_packet", "alias_maximum_out", "aliases_out", "alias_maximum_in", "aliases_in",
        "session", "peer", "request_problem_info", "clean_disconnect", "congested", "overloaded", "link", "flush_pending",
        "held_acks",
    )

    def __init__(self, max_packet_size: int, topic_alias_maximum: int, peer: str) -> None:
        self.reader = PacketReader(max_packet_size)
        self.out = bytearray()
        self.state = AWAITING_CONNECT
        self.protocol_level = pk.MQTT_311
        self.v5 = False
        self.client_id = ""
        self.username: str | None = None
        self.keep_alive = 0
        self.last_received = 0.0
        self.send_quota = 65535
        self.max_outbound_packet = 268_435_460
        self.alias_maximum_out = 0
        self.aliases_out: dict[str, int] = {}
        self.alias_maximum_in = topic_alias_maximum
        self.aliases_in: dict[int, str] = {}
        self.session: SessionT | None = None
        self.peer = peer
        self.request_problem_info = True
        self.clean_disconnect = False
        #: Set by the socket layer while the transport's write buffer is over its high-water mark: the
        #: broker holds back the publishers feeding this connection.
        self.congested = False
        #: Congested for longer than the socket layer's grace period: a slow consumer, so QoS 0 messages
        #: for it are dropped (and counted) instead of holding publishers back any longer.
        self.overloaded = False
        #: Where in ``out`` the acknowledgements start that wait on this turn's commit of the broker's
        #: store (``store_failure.CommitGate``): offsets only, read back into packets if the commit fails.
        self.held_acks: list[int] = []
        #: Whether the broker has this connection in its list of buffers to write this loop turn.
        self.flush_pending = False
        #: The socket layer's handle for this connection, opaque here.
        self.link: Any = None

    def receive(self, data: bytes, now: float) -> list[pk.Packet]:
        """Parse every complete packet in ``data``; raises ``MqttProtocolError`` for bad input."""
        self.last_received = now
        return self.reader.feed(data)

    def accept_connect(self, connect: pk.Connect, client_id: str, keep_alive: int, inflight_cap: int = 0) -> None:
        """Adopt the limits a CONNECT asked for (MQTT 5 3.1.2.11). ``inflight_cap`` (0: none) bounds the
        outbound QoS 1/2 window below the client's Receive Maximum: a 3.1.1 client has no way to announce
        one, so without the cap a client that never acknowledges would be sent the whole queue."""
        self.protocol_level = connect.protocol_level
        self.v5 = connect.protocol_level == pk.MQTT_5
        self.client_id = client_id
        self.username = connect.username
        self.keep_alive = keep_alive
        properties = connect.properties
        receive_maximum = properties.get(0x21, 65535)
        self.send_quota = min(receive_maximum, inflight_cap) if inflight_cap else receive_maximum
        self.max_outbound_packet = properties.get(0x27, 268_435_460)
        self.alias_maximum_out = properties.get(0x22, 0)
        self.request_problem_info = properties.get(0x17, 1) == 1

    def resolve_topic(self, publish: pk.Publish) -> bool:
        """Replace an inbound topic alias by its topic (MQTT 5 3.3.2.3.4); the reader has checked the
        topic name already, all that is left is that there is one. Returns whether an alias was involved
        (then the received frame cannot be forwarded as is)."""
        aliased = False
        if self.v5:
            properties = publish.properties
            alias = properties.pop(TOPIC_ALIAS, None) if properties else None
            if alias is not None:
                aliased = True
                if alias > self.alias_maximum_in:
                    raise MqttProtocolError(TOPIC_ALIAS_INVALID, f"topic alias {alias} above the maximum")
                if publish.topic:
                    self.aliases_in[alias] = publish.topic
                else:
                    topic = self.aliases_in.get(alias)
                    if topic is None:
                        raise MqttProtocolError(PROTOCOL_ERROR, f"unknown topic alias {alias}")
                    publish.topic = topic
        if not publish.topic:
            raise MqttProtocolError(TOPIC_NAME_INVALID, "empty topic name without a topic alias")
        return aliased

    def alias_for(self, topic: str) -> tuple[int, bool]:
        """Our outbound alias for ``topic``: (alias, whether the client already knows it).

        Least recently used replacement: ``aliases_out`` is kept in order of use, and once the client's
        Topic Alias Maximum is used up a new topic takes over the alias of the topic unused for longest.
        Sending that alias with the new topic name remaps it on the client (MQTT 5 3.3.2.3.4), and our
        bytes reach it in order, so later PUBLISHes that carry only the alias are read right."""
        aliases = self.aliases_out
        alias = aliases.pop(topic, None)
        if alias is not None:
            aliases[topic] = alias
            return alias, True
        if len(aliases) < self.alias_maximum_out:
            alias = len(aliases) + 1
        else:
            alias = aliases.pop(next(iter(aliases)))
        aliases[topic] = alias
        return alias, False
