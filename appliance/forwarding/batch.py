"""The upstream batch format: several queued messages in one upstream PUBLISH (docs/message-format.md).

Why it exists: on a 64 kbit/s link a 200-byte reading sent as its own PUBLISH carries about 260 bytes of
``gw-*`` identity user properties, so less than half of what the modem transmits is telemetry. A batch
says who sent it (gateway, priority, send time) once, lists each distinct source (device, module, output,
content type and encoding, TTL, application properties) once, and then costs about five bytes per message
on top of its payload: sequence and enqueue time as deltas from the previous message, an index into the
source table (with one bit saying whether the device gave its own message id) and the payload length.

The pump never mixes priorities in a batch, so the priority is the batch's. The message id the cloud
deduplicates on is ``{gateway_id}:{seq}``, exactly as in the one-message-per-PUBLISH format.

Layout (``uvarint``: unsigned LEB128; ``svarint``: zigzag-encoded signed LEB128; ``str``: uvarint byte
length, then UTF-8; absent optional strings are empty)::

    batch   = "GB" version=0x01 str(gateway_id) uvarint(priority) uvarint(sent_ms)
              uvarint(n_sources) source*  uvarint(n_records) record*
    source  = str(device_id) str(module_id) str(output) str(content_type) str(content_encoding)
              uvarint(ttl_s) uvarint(n_properties) (str(name) str(value))*
    record  = uvarint(source_index << 1 | has_device_message_id) uvarint(seq - previous seq)
              svarint(enqueued_ms - previous enqueued_ms) [str(device_message_id)] uvarint(payload_length) payload

"previous" starts at 0 for the first record; sequence numbers strictly increase within a batch; the
device message id is there only when the low bit of the first field is set.
Pure: no I/O. The gateway encodes; the cloud ingest, the HIL bench's collector and the benchmark decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from appliance.forwarding.identity import gateway_properties

if TYPE_CHECKING:  # the cloud side decodes without loading the gateway's store
    from appliance.forwarding.queues import QueuedMessage

MAGIC = b"GB"
VERSION = 1


class BatchFormatError(ValueError):
    """The bytes are not a batch of this format; the text says what is wrong and at which byte offset."""


@dataclass(frozen=True, slots=True)
class Source:
    device_id: str
    module_id: str | None
    output: str | None
    content_type: str | None
    content_encoding: str | None
    ttl_s: int
    properties: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class BatchRecord:
    message_id: str  # {gateway_id}:{seq}, the cloud's duplicate key
    seq: int
    enqueued_ms: int
    source: Source
    device_message_id: str | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class Batch:
    gateway_id: str
    priority: int
    sent_ms: int
    records: list[BatchRecord]


def _uvarint(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"negative value {value} in an unsigned field")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _svarint(out: bytearray, value: int) -> None:
    _uvarint(out, (value << 1) if value >= 0 else ((-value << 1) - 1))


def _str(out: bytearray, text: str | None) -> None:
    data = (text or "").encode("utf-8")
    _uvarint(out, len(data))
    out += data


def source_of(item: QueuedMessage) -> Source:
    m = item.message
    return Source(m.device_id, m.module_id, m.output, m.content_type, m.content_encoding, item.ttl_s, tuple(m.properties))


def encode_batch(gateway_id: str, priority: int, sent_ms: int, items: Sequence[QueuedMessage]) -> bytes:
    """One batch of ``items`` (all of ``priority``, in sequence order)."""
    sources: dict[Source, int] = {}
    indexes = [sources.setdefault(source_of(item), len(sources)) for item in items]
    out = bytearray(MAGIC)
    out.append(VERSION)
    _str(out, gateway_id)
    _uvarint(out, priority)
    _uvarint(out, sent_ms)
    _uvarint(out, len(sources))
    for source in sources:
        for text in (source.device_id, source.module_id, source.output, source.content_type, source.content_encoding):
            _str(out, text)
        _uvarint(out, source.ttl_s)
        _uvarint(out, len(source.properties))
        for name, value in source.properties:
            _str(out, name)
            _str(out, value)
    _uvarint(out, len(items))
    seq = enqueued = 0
    for item, index in zip(items, indexes, strict=True):
        if item.seq <= seq:
            raise ValueError(f"sequence numbers must increase within a batch: {item.seq} after {seq}")
        device_message_id = item.message.message_id
        _uvarint(out, index << 1 | bool(device_message_id))
        _uvarint(out, item.seq - seq)
        _svarint(out, item.enqueued_ms - enqueued)
        if device_message_id:
            _str(out, device_message_id)
        _uvarint(out, len(item.message.payload))
        out += item.message.payload
        seq, enqueued = item.seq, item.enqueued_ms
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.at = 0

    def fail(self, what: str) -> BatchFormatError:
        return BatchFormatError(f"{what} at byte {self.at}")

    def uvarint(self, what: str) -> int:
        value = shift = 0
        start = self.at
        while True:
            if self.at >= len(self.data):
                self.at = start
                raise self.fail(f"truncated {what}")
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                self.at = start
                raise self.fail(f"{what} longer than 64 bits")

    def svarint(self, what: str) -> int:
        raw = self.uvarint(what)
        return (raw >> 1) if not raw & 1 else -((raw + 1) >> 1)

    def bytes(self, what: str) -> bytes:
        length = self.uvarint(f"{what} length")
        if self.at + length > len(self.data):
            raise self.fail(f"{what} of {length} bytes runs past the end")
        chunk = bytes(self.data[self.at : self.at + length])
        self.at += length
        return chunk

    def text(self, what: str) -> str:
        start = self.at
        raw = self.bytes(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.at = start
            raise self.fail(f"{what} is not UTF-8") from None

    def optional_str(self, what: str) -> str | None:
        return self.text(what) or None


def decode_batch(data: bytes) -> Batch:
    """The batch in ``data``; raises ``BatchFormatError`` (and nothing else) for anything malformed."""
    r = _Reader(data)
    if bytes(r.data[:2]) != MAGIC:
        raise r.fail("not a gateway batch (no 'GB' magic)")
    r.at = 2
    if len(data) < 3:
        raise r.fail("truncated version")
    if data[2] != VERSION:
        raise r.fail(f"unsupported batch version {data[2]}")
    r.at = 3
    gateway_id = r.text("gateway id")
    if not gateway_id:
        raise r.fail("empty gateway id")
    priority = r.uvarint("priority")
    sent_ms = r.uvarint("sent time")
    sources = []
    for n in range(r.uvarint("source count")):
        device_id = r.text(f"source {n} device id")
        if not device_id:
            raise r.fail(f"source {n} has an empty device id")
        module_id, output, content_type, content_encoding = (
            r.optional_str(f"source {n} {field}") for field in ("module id", "output", "content type", "content encoding")
        )
        ttl_s = r.uvarint(f"source {n} ttl")
        properties = tuple((r.text(f"source {n} property name"), r.text(f"source {n} property value"))
                           for _ in range(r.uvarint(f"source {n} property count")))
        sources.append(Source(device_id, module_id, output, content_type, content_encoding, ttl_s, properties))
    records = []
    seq = enqueued = 0
    for n in range(r.uvarint("record count")):
        first = r.uvarint(f"record {n} source index")
        index, has_device_message_id = first >> 1, first & 1
        if index >= len(sources):
            raise r.fail(f"record {n} names source {index} of {len(sources)}")
        delta = r.uvarint(f"record {n} sequence delta")
        if delta == 0:
            raise r.fail(f"record {n} repeats sequence number {seq}")
        seq += delta
        enqueued += r.svarint(f"record {n} enqueue time delta")
        device_message_id = r.text(f"record {n} device message id") if has_device_message_id else None
        payload = r.bytes(f"record {n} payload")
        records.append(BatchRecord(f"{gateway_id}:{seq}", seq, enqueued, sources[index], device_message_id, payload))
    if r.at != len(data):
        raise r.fail(f"{len(data) - r.at} bytes after the last record")
    return Batch(gateway_id, priority, sent_ms, records)


def record_properties(batch: Batch, record: BatchRecord) -> list[tuple[str, str]]:
    """The user properties ``record`` would carry as a one-message PUBLISH: ``gw-*``, then the device's own."""
    source = record.source
    return gateway_properties(
        record.message_id, batch.gateway_id, source.device_id, source.module_id, source.output, batch.priority,
        record.enqueued_ms, batch.sent_ms, source.ttl_s,
    ) + list(source.properties)
