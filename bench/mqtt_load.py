"""The benchmark's load generator: raw asyncio sockets, pre-encoded MQTT packets, several processes.

Why it is built this way:

* A paho client spends tens of microseconds of Python per message; a generator built on it would
  saturate long before mosquitto does (~80,000 msgs/s here). So every packet a client sends is encoded
  once, up front: a QoS 0 publisher writes one pre-joined chunk of identical PUBLISH frames per write, a
  QoS 1 publisher picks its frame from a ring of pre-encoded packet ids. Only the latency publisher builds
  frames on the fly (it stamps each one), and it runs at 2,000 msgs/s.
* What a client receives goes through ``FrameReader``, which only walks fixed headers (type byte and
  remaining length) and hands back offsets into the buffer; a subscriber reads a packet id or a
  timestamp at a known offset and never decodes the rest.
* Clients are ``asyncio.Protocol`` callbacks (no per-message coroutine or Stream), on uvloop when
  installed, and the clients of one run are spread over several processes (``multiprocessing``, spawn),
  so publishers and subscribers do not share one GIL.
* To show the generator is not the bottleneck, every worker reports the CPU time it used inside the
  measuring window; the caller compares it with the broker's (``bench/broker.py`` does).

Timing is shared through ``time.monotonic()``, which on Linux is one system-wide clock: the parent picks
``t0`` once every worker is connected, and every process derives the same warm-up, measuring window and
stop time from it. Every run is bounded: workers give up at a hard deadline and the parent terminates
any that outlive it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import resource
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import uvloop

MQTT_311 = 4
MQTT_5 = 5

CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
SUBACK = 0x90

#: Packet ids a QoS 1 publisher cycles through; far more than any window, so an id comes round again
#: only long after its PUBACK.
PACKET_ID_RING = 4096
#: Bytes of pre-joined QoS 0 frames per write: large enough that the per-write cost vanishes.
FLOOD_CHUNK_BYTES = 32 * 1024
#: Writes in a row before a flooding publisher yields to the loop (so timers and reads still run).
FLOOD_WRITES_PER_TURN = 16
#: CONNECTs in progress at once per process. Two processes stay under mosquitto's listen backlog of 100:
#: an overflowing backlog drops a SYN, whose one-second retransmit would measure the kernel, not the broker.
CONNECTS_IN_FLIGHT = 32
#: How long a worker waits for anything (connecting, the parent's go) before it gives up.
SETUP_TIMEOUT = 60.0
#: Latency samples are kept from this many messages at most per subscriber.
MAX_LATENCY_SAMPLES = 200_000

Role = Literal["publisher", "subscriber", "connector"]


# -- encoding: everything a client sends, built once ------------------------------------------------


def encode_varint(value: int) -> bytes:
    """MQTT's variable byte integer (remaining length, property lengths)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def encode_string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack(">H", len(data)) + data


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def connect_packet(client_id: str, version: int, keep_alive: int = 60, receive_maximum: int | None = None,
                   durable: bool = False) -> bytes:
    """CONNECT with clean start; MQTT 5 may announce a Receive Maximum (how many QoS 1 we take unacked).
    ``durable`` asks for a session that outlives the connection (3.1.1: clean session off; MQTT 5: clean
    start with a Session Expiry Interval of one hour), so the broker stores its QoS 1/2 deliveries."""
    flags = 0x00 if durable and version != MQTT_5 else 0x02
    header = encode_string("MQTT") + bytes((version, flags)) + struct.pack(">H", keep_alive)
    if version == MQTT_5:
        properties = b"" if receive_maximum is None else b"\x21" + struct.pack(">H", receive_maximum)
        if durable:
            properties += b"\x11" + struct.pack(">I", 3600)
        header += encode_varint(len(properties)) + properties
    return frame(0x10, header + encode_string(client_id))


def subscribe_packet(packet_id: int, topic_filter: str, qos: int, version: int) -> bytes:
    properties = b"\x00" if version == MQTT_5 else b""
    return frame(0x82, struct.pack(">H", packet_id) + properties + encode_string(topic_filter) + bytes((qos,)))


def publish_packet(topic: str, payload: bytes, qos: int, packet_id: int, version: int) -> bytes:
    head = encode_string(topic) + (struct.pack(">H", packet_id) if qos else b"")
    if version == MQTT_5:
        head += b"\x00"
    return frame(PUBLISH | (qos << 1), head + payload)


# -- decoding: only fixed headers ---------------------------------------------------------------------


class FrameReader:
    """Incremental framing of what a client receives.

    ``feed`` returns ``(first_byte, body_start, body_end)`` for every complete packet, offsets into
    ``self.buffer`` (valid until the next ``feed``); a partial packet is kept for the next call.
    """

    __slots__ = ("buffer", "_rest")

    def __init__(self) -> None:
        self.buffer = b""
        self._rest = b""

    def feed(self, data: bytes) -> list[tuple[int, int, int]]:
        buf = self._rest + data if self._rest else data
        self.buffer = buf
        end = len(buf)
        pos = 0
        frames: list[tuple[int, int, int]] = []
        append = frames.append
        while end - pos >= 2:
            length = buf[pos + 1]
            start = pos + 2
            if length & 0x80:
                length &= 0x7F
                shift = 7
                while True:
                    if start >= end:
                        self._rest = buf[pos:]
                        return frames
                    byte = buf[start]
                    start += 1
                    length |= (byte & 0x7F) << shift
                    if not byte & 0x80:
                        break
                    shift += 7
            stop = start + length
            if stop > end:
                break
            append((buf[pos], start, stop))
            pos = stop
        self._rest = buf[pos:] if pos < end else b""
        return frames


# -- what a worker is asked to do, and what it reports -------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One process's share of a load. ``rate`` (messages/s per client) paces a publisher, None floods;
    ``window`` bounds a QoS 1 publisher's unacknowledged messages; ``receive_maximum`` is what a
    subscriber announces in CONNECT (MQTT 5); ``stamp`` puts the send time in the payload's last 8
    bytes, and makes subscribers measure latency; ``durable`` gives a subscriber a session that outlives
    its connection."""

    role: Role
    host: str
    port: int
    clients: int
    client_prefix: str
    topic: str = "bench/load"
    qos: int = 0
    version: int = MQTT_5
    payload_size: int = 64
    rate: float | None = None
    window: int = 64
    receive_maximum: int | None = None
    stamp: bool = False
    durable: bool = False


@dataclass(frozen=True, slots=True)
class Schedule:
    """Seconds after ``t0``: traffic starts at once, is measured from ``warmup`` for ``duration``, and
    publishers keep going ``tail`` seconds longer so subscribers are still busy when the window closes."""

    warmup: float
    duration: float
    tail: float = 0.3

    @property
    def window_start(self) -> float:
        return self.warmup

    @property
    def window_end(self) -> float:
        return self.warmup + self.duration

    @property
    def stop(self) -> float:
        return self.warmup + self.duration + self.tail


@dataclass(slots=True)
class WorkerResult:
    """Counts are for the measuring window only (connectors: for the whole connect phase)."""

    index: int
    role: Role
    sent: int = 0
    acked: int = 0
    received: int = 0
    cpu_seconds: float = 0.0
    latencies_us: list[int] = field(default_factory=list)
    connect_seconds: float = 0.0
    connected: int = 0
    #: Milliseconds a paced publisher had messages due but a full QoS 1 window (they went out late, so
    #: their latency is understated: the broker did not keep up).
    window_full_ms: int = 0
    errors: list[str] = field(default_factory=list)


# -- clients -------------------------------------------------------------------------------------------


class Client(asyncio.Protocol):
    """One MQTT connection. Sends CONNECT when the socket opens; ``ready`` resolves at CONNACK (and at
    SUBACK when ``subscribe`` is given). Subclasses take over the traffic in ``on_frames``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connect: bytes, subscribe: bytes | None = None) -> None:
        self.loop = loop
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self._connect = connect
        self._subscribe = subscribe
        self._handshaking = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        transport.write(self._connect)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        frames = self.reader.feed(data)
        if self._handshaking:
            frames = self._handshake(frames)
        if frames:
            self.on_frames(self.reader.buffer, frames)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"closed during the handshake: {exc}"))
        if not self.lost.done():
            self.lost.set_result(None)

    def on_frames(self, buf: bytes, frames: list[tuple[int, int, int]]) -> None:
        """Traffic after the handshake; the base client ignores it."""

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _handshake(self, frames: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        buf = self.reader.buffer
        for index, (first, start, stop) in enumerate(frames):
            kind = first & 0xF0
            if kind == CONNACK:
                if stop - start < 2 or buf[start + 1] != 0:
                    self.ready.set_exception(ConnectionError(f"CONNACK refused: {buf[start:stop].hex()}"))
                    self.close()
                    return []
                if self._subscribe is None:
                    return self._handshake_done(frames, index)
                assert self.transport is not None
                self.transport.write(self._subscribe)
            elif kind == SUBACK:
                granted = buf[stop - 1]
                if granted >= 0x80:
                    self.ready.set_exception(ConnectionError(f"SUBACK refused: {granted:#x}"))
                    self.close()
                    return []
                return self._handshake_done(frames, index)
        return []

    def _handshake_done(self, frames: list[tuple[int, int, int]], index: int) -> list[tuple[int, int, int]]:
        self._handshaking = False
        self.ready.set_result(None)
        return frames[index + 1:]


class Subscriber(Client):
    """Counts PUBLISHes, acknowledges QoS 1 ones (all PUBACKs of one read in one write) and, when the
    payload carries a send time, records the latency of the messages received inside the window."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connect: bytes, subscribe: bytes, stamped: bool) -> None:
        super().__init__(loop, connect, subscribe)
        self.received = 0
        self.measuring = False
        self.stamped = stamped
        self.latencies_us: list[int] = []

    def on_frames(self, buf: bytes, frames: list[tuple[int, int, int]]) -> None:
        count = 0
        acks: list[bytes] = []
        for first, start, _stop in frames:
            if first & 0xF0 != PUBLISH:
                continue
            count += 1
            if first & 0x06:
                at = start + 2 + ((buf[start] << 8) | buf[start + 1])
                acks.append(b"\x40\x02" + buf[at:at + 2])
        self.received += count
        if acks and self.transport is not None:
            self.transport.write(b"".join(acks))
        if self.stamped and self.measuring and len(self.latencies_us) < MAX_LATENCY_SAMPLES:
            now = time.monotonic_ns()
            samples = self.latencies_us
            for first, _start, stop in frames:
                if first & 0xF0 == PUBLISH:
                    samples.append((now - int.from_bytes(buf[stop - 8:stop], "big")) // 1000)


class FloodPublisher(Client):
    """QoS 0 as fast as the broker reads: pre-joined chunks of identical frames, written until the
    transport's buffer passes its high-water mark (``pause_writing``), resumed by ``resume_writing``.
    With ``rate`` (messages/s) it writes what is due every millisecond instead: a steady background
    load that both brokers can carry."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connect: bytes, publish: bytes, rate: float | None) -> None:
        super().__init__(loop, connect)
        per_chunk = max(1, FLOOD_CHUNK_BYTES // len(publish))
        self.publish = publish
        self.chunk = publish * per_chunk
        self.per_chunk = per_chunk
        self.rate = rate
        self.sent = 0
        self.running = False
        self.paused = False
        self._started_at = 0.0

    def start(self) -> None:
        assert self.transport is not None
        self.transport.set_write_buffer_limits(high=4 * FLOOD_CHUNK_BYTES)
        self.running = True
        self._started_at = time.monotonic()
        if self.rate is None:
            self._pump()
        else:
            self._tick()

    def stop(self) -> None:
        self.running = False

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._pump()

    def _pump(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        for _ in range(FLOOD_WRITES_PER_TURN):
            if self.paused or not self.running:
                return
            transport.write(self.chunk)
            self.sent += self.per_chunk
        self.loop.call_soon(self._pump)

    def _tick(self) -> None:
        transport = self.transport
        if not self.running or transport is None or transport.is_closing():
            return
        assert self.rate is not None
        due = int((time.monotonic() - self._started_at) * self.rate) - self.sent
        if due > 0 and not self.paused:
            transport.write(self.publish * due)
            self.sent += due
        self.loop.call_later(0.001, self._tick)


class WindowPublisher(Client):
    """QoS 1 with at most ``window`` messages unacknowledged; each PUBACK read lets as many new ones go.
    With ``rate`` it is paced instead (1 ms ticks, sending what is due) and the frames are built per
    message with the send time in the payload's last 8 bytes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connect: bytes, spec: WorkerSpec) -> None:
        super().__init__(loop, connect)
        self.spec = spec
        self.window = spec.window
        self.sent = 0
        self.acked = 0
        self.window_full_ticks = 0
        self.running = False
        self.inflight: set[int] = set()
        self._next = 1
        self._started_at = 0.0
        if spec.stamp and spec.payload_size < 8:
            raise ValueError("a stamped payload needs at least 8 bytes for the send time")
        payload = bytes(spec.payload_size)
        self._frames = [publish_packet(spec.topic, payload, 1, pid, spec.version) for pid in range(1, PACKET_ID_RING + 1)]

    def start(self) -> None:
        self.running = True
        self._started_at = time.monotonic()
        if self.spec.rate is None:
            self._send(self.window)
        else:
            self._tick()

    def stop(self) -> None:
        self.running = False

    def on_frames(self, buf: bytes, frames: list[tuple[int, int, int]]) -> None:
        inflight = self.inflight
        for first, start, _stop in frames:
            if first & 0xF0 == PUBACK:
                inflight.discard((buf[start] << 8) | buf[start + 1])
                self.acked += 1
        if self.running and self.spec.rate is None:
            self._send(self.window - len(inflight))

    def _send(self, count: int) -> None:
        transport = self.transport
        if count <= 0 or transport is None or transport.is_closing():
            return
        out: list[bytes] = []
        inflight = self.inflight
        stamp = self.spec.stamp
        now = time.monotonic_ns().to_bytes(8, "big") if stamp else b""
        for _ in range(count):
            pid = self._next
            if pid in inflight:  # the ring came round to an unacknowledged id: wait for its PUBACK
                break
            self._next = pid % PACKET_ID_RING + 1
            inflight.add(pid)
            out.append(self._frames[pid - 1][:-8] + now if stamp else self._frames[pid - 1])
        self.sent += len(out)
        transport.write(b"".join(out))

    def _tick(self) -> None:
        if not self.running:
            return
        assert self.spec.rate is not None
        due = int((time.monotonic() - self._started_at) * self.spec.rate) - self.sent
        room = self.window - len(self.inflight)
        if due > room:
            self.window_full_ticks += 1
        self._send(min(due, room))
        self.loop.call_later(0.001, self._tick)


# -- a worker process ----------------------------------------------------------------------------------


def raise_fd_limit() -> int:
    """Lift the soft open-files limit to the hard one (2,000 connections need more than 1,024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


@dataclass(slots=True)
class Channel:
    """How the parent and the workers talk: messages up, events and the shared ``t0`` down."""

    messages: Any
    go: Any
    release: Any
    t0: Any


def run_worker(index: int, spec: WorkerSpec, schedule: Schedule, channel: Channel) -> None:
    """Process entry point: run one worker on uvloop, as the gateway runs, and report its result."""
    raise_fd_limit()
    result = WorkerResult(index, spec.role)
    try:
        uvloop.run(_work(index, spec, schedule, channel, result))
    except Exception as exc:  # reported, so the parent can say what broke instead of timing out
        result.errors.append(f"{type(exc).__name__}: {exc}")
    channel.messages.put(("result", index, result))


async def _open(loop: asyncio.AbstractEventLoop, spec: WorkerSpec, factory: Callable[[], Client]) -> Client:
    _, client = await loop.create_connection(factory, spec.host, spec.port)
    await asyncio.wait_for(client.ready, SETUP_TIMEOUT)
    return client


async def _wait_event(event: Any, timeout: float) -> None:
    if not await asyncio.get_running_loop().run_in_executor(None, event.wait, timeout):
        raise TimeoutError("the parent never said go")


async def _work(index: int, spec: WorkerSpec, schedule: Schedule, channel: Channel, result: WorkerResult) -> None:
    if spec.role == "connector":
        await _connect_many(index, spec, channel, result)
        return
    loop = asyncio.get_running_loop()
    clients: list[Any] = []
    for number in range(spec.clients):
        client_id = f"{spec.client_prefix}-{number}"
        if spec.role == "subscriber":
            connect = connect_packet(client_id, spec.version, receive_maximum=spec.receive_maximum, durable=spec.durable)
            subscribe = subscribe_packet(1, spec.topic, spec.qos, spec.version)
            clients.append(await _open(loop, spec, lambda c=connect, s=subscribe: Subscriber(loop, c, s, spec.stamp)))
        elif spec.qos == 0:
            publish = publish_packet(spec.topic, bytes(spec.payload_size), 0, 0, spec.version)
            connect = connect_packet(client_id, spec.version)
            clients.append(await _open(loop, spec, lambda c=connect, p=publish: FloodPublisher(loop, c, p, spec.rate)))
        else:
            connect = connect_packet(client_id, spec.version)
            clients.append(await _open(loop, spec, lambda c=connect: WindowPublisher(loop, c, spec)))
    channel.messages.put(("ready", index, None))
    await _wait_event(channel.go, SETUP_TIMEOUT)
    t0 = channel.t0.value
    window_closed = asyncio.Event()
    marks: dict[str, tuple[float, int, int, int]] = {}

    def mark(name: str) -> None:
        """Snapshot CPU time and counters at a window edge; the result is the difference."""
        marks[name] = (
            time.process_time(),
            sum(getattr(c, "sent", 0) for c in clients),
            sum(getattr(c, "acked", 0) for c in clients),
            sum(getattr(c, "received", 0) for c in clients),
        )
        for client in clients:
            if isinstance(client, Subscriber):
                client.measuring = name == "start"
        if name == "end":
            window_closed.set()

    def start_publishing() -> None:
        for client in clients:
            if not isinstance(client, Subscriber):
                client.start()

    now = time.monotonic()
    loop.call_later(max(0.0, t0 - now), start_publishing)
    loop.call_later(max(0.0, t0 + schedule.window_start - now), mark, "start")
    loop.call_later(max(0.0, t0 + schedule.window_end - now), mark, "end")
    await window_closed.wait()
    await asyncio.sleep(max(0.0, t0 + schedule.stop - time.monotonic()))
    for client in clients:
        if not isinstance(client, Subscriber):
            client.stop()
    start, end = marks["start"], marks["end"]
    result.cpu_seconds = end[0] - start[0]
    result.sent, result.acked, result.received = end[1] - start[1], end[2] - start[2], end[3] - start[3]
    for client in clients:
        if isinstance(client, Subscriber):
            result.latencies_us.extend(client.latencies_us)
        if isinstance(client, WindowPublisher):
            result.window_full_ms += client.window_full_ticks
        client.close()


async def _connect_many(index: int, spec: WorkerSpec, channel: Channel, result: WorkerResult) -> None:
    """Open ``spec.clients`` MQTT connections at once (bounded in-flight handshakes), report, hold them
    until the parent has measured the broker, then close them."""
    loop = asyncio.get_running_loop()
    channel.messages.put(("ready", index, None))
    await _wait_event(channel.go, SETUP_TIMEOUT)
    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)
    clients: list[Client] = []

    async def one(number: int) -> None:
        connect = connect_packet(f"{spec.client_prefix}-{number}", spec.version)
        async with gate:
            try:
                clients.append(await _open(loop, spec, lambda: Client(loop, connect)))
            except (OSError, TimeoutError) as exc:
                result.errors.append(f"{type(exc).__name__}: {exc}")

    cpu = time.process_time()
    delay = channel.t0.value - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    started = time.monotonic()
    await asyncio.gather(*(one(number) for number in range(spec.clients)))
    result.connect_seconds = time.monotonic() - started
    result.cpu_seconds = time.process_time() - cpu
    result.connected = len(clients)
    channel.messages.put(("connected", index, result.connected))
    await _wait_event(channel.release, SETUP_TIMEOUT)
    for client in clients:
        client.close()
    await asyncio.gather(*(client.lost for client in clients))


# -- the parent side -----------------------------------------------------------------------------------


def run_load(
    specs: list[WorkerSpec],
    schedule: Schedule,
    on_event: Callable[[str], None] = lambda name: None,
    timeout: float = SETUP_TIMEOUT,
) -> list[WorkerResult]:
    """Run one load: one process per spec, started together once every one of them is connected.

    ``on_event`` is called in this process at ``"window-start"`` and ``"window-end"`` (to sample the
    broker at the same moments the workers do), or, for connectors, at ``"connected"`` while every
    connection is still open.
    """
    context = multiprocessing.get_context("spawn")
    channel = Channel(context.Queue(), context.Event(), context.Event(), context.Value("d", 0.0))
    processes = [
        context.Process(target=run_worker, args=(index, spec, schedule, channel), name=f"mqtt-load-{index}", daemon=True)
        for index, spec in enumerate(specs)
    ]
    results: dict[int, WorkerResult] = {}
    inbox: dict[str, set[int]] = {"ready": set(), "connected": set()}

    def wait_for(kind: str, deadline: float) -> None:
        """Until every worker has sent ``kind`` or ended (a result, possibly carrying its errors)."""
        while any(index not in results and index not in inbox.get(kind, ()) for index in range(len(specs))):
            try:
                message, index, payload = channel.messages.get(timeout=0.5)
            except queue.Empty:
                dead = [p.name for i, p in enumerate(processes) if i not in results and p.exitcode is not None]
                if dead:
                    raise RuntimeError(f"load workers died without a result: {', '.join(dead)}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"load workers did not report {kind!r} in time") from None
                continue
            if message == "result":
                results[index] = payload
            else:
                inbox[message].add(index)

    try:
        for process in processes:
            process.start()
        wait_for("ready", time.monotonic() + timeout)
        if results:
            errors = [error for result in results.values() for error in result.errors]
            raise RuntimeError(f"load workers failed while connecting: {errors}")
        channel.t0.value = time.monotonic() + 0.05
        channel.go.set()
        if any(spec.role == "connector" for spec in specs):
            wait_for("connected", time.monotonic() + timeout)
            on_event("connected")
            channel.release.set()
        else:
            t0 = channel.t0.value
            _sleep_until(t0 + schedule.window_start)
            on_event("window-start")
            _sleep_until(t0 + schedule.window_end)
            on_event("window-end")
        wait_for("result", time.monotonic() + schedule.tail + timeout)
    finally:
        channel.release.set()
        for process in processes:
            if process.pid is None:
                continue
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
    return [results[index] for index in range(len(specs))]


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)

