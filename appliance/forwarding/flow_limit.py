"""How much the upstream bridge may have in flight on its connection: the measured link's window, in the
upstream's message format, bounded by what the server announced in its CONNACK.

Rules
-----
* ``message`` format: a window of ``LinkEstimate.window()`` messages, one PUBLISH each. ``batch`` format:
  ``LinkEstimate.packed_window`` bytes in PUBLISHes of at most ``batch_max_bytes`` and, when the server
  announced a Maximum Packet Size, that size less ``PACKET_OVERHEAD`` (the fixed header, the topic and the
  batch header).
* Never more PUBLISHes unacknowledged than the server's Receive Maximum (MQTT 5 section 3.3.4: a server
  closes a connection that exceeds it, 0x93, and the pump would blame the message at the head for the
  drop); a server that announces none, or MQTT 3.1.1, allows ``RECEIVE_MAXIMUM_DEFAULT``.
* Every CONNACK that accepts a connection sets both limits anew (one that announces none sets the
  defaults): another server may sit behind the same address.

Theory of operation
-------------------
The limit is re-read after every acknowledgement (``UpstreamSender.send``), so it follows the link as the
estimate learns it. Pure: no I/O and no clock; the bridge feeds it the CONNACK's properties.
"""

from __future__ import annotations

from appliance.forwarding.config import UpstreamConfig
from appliance.forwarding.window import LinkEstimate, Window

#: The Receive Maximum of a server that announces none (MQTT 5 section 3.2.2.3.3), and of MQTT 3.1.1.
RECEIVE_MAXIMUM_DEFAULT = 65535
#: Bytes of a packed PUBLISH that are not payload, at most: its fixed header, topic and batch header.
PACKET_OVERHEAD = 512


class FlowLimit:
    """The in-flight limit of one gateway's upstream connection (see the module docstring)."""

    def __init__(self, settings: UpstreamConfig, estimate: LinkEstimate) -> None:
        self.settings = settings
        self.estimate = estimate
        self.max_packet: int | None = None  # the server's Maximum Packet Size (MQTT 5 CONNACK)
        self.receive_max = RECEIVE_MAXIMUM_DEFAULT  # the server's Receive Maximum (MQTT 5 CONNACK)

    def connected(self, max_packet: int | None, receive_max: int | None) -> None:
        """A CONNACK accepted the connection, announcing these limits (None: not announced)."""
        self.max_packet = max_packet
        self.receive_max = receive_max or RECEIVE_MAXIMUM_DEFAULT

    def window(self) -> Window:
        """The batch the pump should read: messages, or bytes and the bytes per PUBLISH."""
        if self.settings.format == "message":
            return self.estimate.window()
        limit = self.settings.batch_max_bytes
        if self.max_packet is not None:
            limit = max(1, min(limit, self.max_packet - PACKET_OVERHEAD))
        return self.estimate.packed_window(limit)

    def in_flight(self) -> int:
        """PUBLISHes that may be unacknowledged now."""
        window = self.window()
        if window.chunk_bytes is None:
            return min(window.messages, self.receive_max)
        assert window.bytes is not None
        return min(max(2, -(-window.bytes // window.chunk_bytes)), self.receive_max)
