"""An application message inside the broker, from the PUBLISH that brought it to every delivery.

One ``BrokerMessage`` is shared by all the sessions it is delivered to. The expensive part of a delivery is
encoding, and most deliveries of one message differ only in QoS, the retain flag and the packet id, so
the message caches what does not vary: the UTF-8 topic, the MQTT 5 property block, and the complete QoS 0
frames. A fan-out to a hundred QoS 0 subscribers encodes the PUBLISH once per protocol version.

Better still, most deliveries are byte for byte the PUBLISH that came in (same protocol version, QoS and
flags), except for the packet id: ``raw`` keeps the received frame, and such a delivery is that frame,
or that frame with a new packet id spliced in. The hot path of a broker is mostly copying.
"""

from __future__ import annotations

import struct

from appliance.broker.codec.properties import (
    MESSAGE_EXPIRY_INTERVAL,
    SUBSCRIPTION_IDENTIFIER,
    TOPIC_ALIAS,
    Properties,
    encode_properties,
)
from appliance.broker.codec.writer import encode_publish

NO_PROPERTIES = b"\x00"
_U16 = struct.Struct(">H")


class BrokerMessage:
    """``properties`` are the PUBLISH properties that travel with the message (never a topic alias or a
    subscription identifier); ``expires_at`` is a wall-clock time (seconds) or None."""

    __slots__ = ("topic", "payload", "qos", "retain", "properties", "expires_at", "origin",
                 "topic_bytes", "raw", "raw_v5", "_props_block", "_frames", "_id_offset")

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: Properties,
        origin: str | None,
        expires_at: float | None = None,
        raw: bytes | None = None,
        raw_v5: bool = False,
        topic_bytes: bytes | None = None,
    ) -> None:
        """``raw``: the PUBLISH as received (MQTT 5 if ``raw_v5``), only when its bytes say exactly what
        this message says (no topic alias, no expiry to count down). ``topic_bytes``: ``topic`` in UTF-8,
        when the caller has it already (the short path's route cache: one shared object instead of an
        encoding per message)."""
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.origin = origin
        self.expires_at = expires_at
        self.topic_bytes = topic_bytes if topic_bytes is not None else topic.encode("utf-8")
        self.raw = raw
        self.raw_v5 = raw_v5
        self._props_block: bytes | None = None
        self._frames: dict[int, bytes] | None = None
        self._id_offset = 0

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def frame(
        self,
        v5: bool,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        subscription_ids: list[int] | None,
        now: float,
        alias: int = 0,
        alias_known: bool = False,
    ) -> bytes:
        """The PUBLISH bytes for one delivery. ``alias`` (MQTT 5 only) replaces the topic when
        ``alias_known``, or establishes the alias otherwise."""
        simple = not subscription_ids and self.expires_at is None and not alias
        raw = self.raw
        if raw is not None and simple and not retain and not dup and v5 == self.raw_v5:
            first = raw[0]
            if qos == 0 and first == 0x30:
                return raw
            if qos and first == 0x30 | (qos << 1):
                offset = self._id_offset
                if not offset:
                    # After the fixed header and the topic; a remaining length below 128 is one byte.
                    offset = self._id_offset = 4 + ((raw[2] << 8) | raw[3]) if raw[1] < 0x80 else self._find_id_offset(raw)
                return raw[:offset] + _U16.pack(packet_id or 0) + raw[offset + 2 :]
        if qos == 0 and simple:
            key = (2 if v5 else 0) | (1 if retain else 0)
            frames = self._frames
            if frames is None:
                frames = self._frames = {}
            frame = frames.get(key)
            if frame is None:
                frame = frames[key] = encode_publish(
                    self.topic_bytes, self.payload, 0, retain, False, None, self._block() if v5 else None
                )
            return frame
        if not v5:
            return encode_publish(self.topic_bytes, self.payload, qos, retain, dup, packet_id, None)
        if simple:
            return encode_publish(self.topic_bytes, self.payload, qos, retain, dup, packet_id, self._block())
        properties = dict(self.properties)
        if self.expires_at is not None:
            properties[MESSAGE_EXPIRY_INTERVAL] = max(0, int(self.expires_at - now + 0.999))
        if subscription_ids:
            properties[SUBSCRIPTION_IDENTIFIER] = subscription_ids
        if alias:
            properties[TOPIC_ALIAS] = alias
        topic = b"" if alias_known else self.topic_bytes
        return encode_publish(topic, self.payload, qos, retain, dup, packet_id, encode_properties(properties))

    def _find_id_offset(self, raw: bytes) -> int:
        """Where the packet id sits in ``raw``: after the fixed header and the topic."""
        index = 1
        while raw[index] & 0x80:
            index += 1
        offset = index + 3 + ((raw[index + 1] << 8) | raw[index + 2])
        self._id_offset = offset
        return offset

    def _block(self) -> bytes:
        block = self._props_block
        if block is None:
            block = self._props_block = encode_properties(self.properties) if self.properties else NO_PROPERTIES
        return block
