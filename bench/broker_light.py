"""Our gateway's broker beside mosquitto under a light, independent load generator (issue 30).

    .venv/bin/python bench/broker_light.py                        # every scenario, 3 rounds
    .venv/bin/python bench/broker_light.py --only qos1 --rounds 5 --messages 200000
    .venv/bin/python bench/broker_light.py --pin                  # broker under test on CPU 1, generator on CPU 0

Why a second generator: ``bench/mqtt_load.py`` answers every read at once, so against mosquitto, which
writes each PUBACK on its own, its publishers read many small segments and write one small refill per
segment; with its worker processes it took 86-94 % of a core while mosquitto ran, and on 2 cores that
starves the broker it measures. The issue's outside measurement used one asyncio + uvloop process
instead. This one is built like that, and light:

* One process, one uvloop loop, ``asyncio.Protocol`` callbacks on raw TCP sockets. Its own few lines of
  MQTT 5 (CONNECT, SUBSCRIBE, PUBLISH, PUBACK), nothing from ``appliance``: it is independent of the
  broker under test.
* No work per message in Python on the hot path. A subscriber's read of many PUBLISHes of one size is
  checked and counted with strided slices (every frame's type byte and remaining length is compared, so
  the count is exact), and its PUBACKs are built the same way from the packet ids' columns; a publisher
  counts a read of 4-byte PUBACKs the same way. Any other read goes through a plain frame walk.
* A QoS 1 publisher keeps ``window`` PUBLISHes unacknowledged, paced by PUBACKs, but refills once per
  loop turn (``call_soon``), not once per read: one write however many segments the PUBACKs came in.

Throughput is counted end to end at the subscriber: the time between its ``--warmup``-th message and
``--warmup + --messages``-th (100,000 by default, as the issue measured). Each round line prints the broker's
CPU time (user + system) per message, the generator's own CPU time (share of a core and per message), the
other processes' CPU, and the load average: a generator near 100 % of a core, or "other" near a core, means
the figure is not the broker's. Rounds alternate which broker goes first. ``qos1_durable`` compares our
durable subscriber (``broker.db``, commit before PUBACK) with a mosquitto that runs ``persistence true``.
``qos1_latency`` paces one publisher at 2,000 msgs/s for ``--latency-seconds`` and reports p50/p99 from the
send time stamped in the payload to the subscriber's read (one process: one clock).

``--pin`` gives the broker under test a core of its own: every thread of every broker on ``--broker-cpu``
(1), the generator on ``--generator-cpu`` (0), as ``taskset -a -p`` does (``sched_setaffinity`` per
thread). Unpinned, mosquitto shares a core with the generator: it writes every packet on its own, so the
generator reads about 2 messages per read against it and takes 85-92 % of a core, and the scheduler
splits the second core between them. Pinned, each broker gets one whole core and the generator the other,
so the ratio is one broker's core against the other's (the machine must have nothing else running for
that to hold: the load average is printed with every round).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import uvloop

if __package__ in (None, ""):  # run by path: make ``bench`` and ``testing`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.broker import brokers  # noqa: E402

PUBLISH = 0x30
PUBACK = 0x40
CONNACK = 0x20
SUBACK = 0x90
#: A QoS 1 publisher cycles through this many pre-encoded packet ids, far more than its window.
ID_RING = 4096
#: Bytes of identical QoS 0 frames per write.
FLOOD_CHUNK = 32 * 1024
#: Seconds any one step (connecting, a round) may take before the run gives up.
STEP_TIMEOUT = 60.0

SCENARIOS = ("qos0_fanin", "qos1", "qos1_durable", "qos1_latency")


# -- MQTT 5, the few packets a load needs ----------------------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def utf8(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


def connect(client_id: str, receive_maximum: int | None = None, session_expiry: int = 0) -> bytes:
    """CONNECT, MQTT 5, clean start; a session expiry makes the session durable."""
    properties = b""
    if receive_maximum is not None:
        properties += b"\x21" + struct.pack(">H", receive_maximum)
    if session_expiry:
        properties += b"\x11" + struct.pack(">I", session_expiry)
    body = utf8("MQTT") + bytes((5, 0x02)) + struct.pack(">H", 60) + varint(len(properties)) + properties
    return packet(0x10, body + utf8(client_id))


def subscribe(topic_filter: str, qos: int) -> bytes:
    return packet(0x82, struct.pack(">H", 1) + b"\x00" + utf8(topic_filter) + bytes((qos,)))


def publish(topic: str, payload: bytes, qos: int, packet_id: int = 0) -> bytes:
    packet_id_bytes = struct.pack(">H", packet_id) if qos else b""
    return packet(PUBLISH | qos << 1, utf8(topic) + packet_id_bytes + b"\x00" + payload)


def walk(buf: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """Every whole packet in ``buf`` as (first byte, body start, body end), and where the rest starts."""
    frames: list[tuple[int, int, int]] = []
    pos, end = 0, len(buf)
    while end - pos >= 2:
        length, start, shift = 0, pos + 1, 0
        while True:
            if start >= end:
                return frames, pos
            byte = buf[start]
            start += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if start + length > end:
            break
        frames.append((buf[pos], start, start + length))
        pos = start + length
    return frames, pos


def uniform_run(buf: bytes, head: bytes, size: int) -> int:
    """How many ``size``-byte packets starting with the two bytes ``head`` open ``buf``, every one checked
    (``head`` holds the remaining length, so equal heads mean equal lengths), counted in C."""
    count = len(buf) // size
    whole = count * size
    if count and buf[0:whole:size] == head[:1] * count and buf[1:whole:size] == head[1:] * count:
        return count
    return 0


# -- clients -----------------------------------------------------------------------------------------------


class Client(asyncio.Protocol):
    """One connection: CONNECT (and SUBSCRIBE) on open, ``ready`` at CONNACK (SUBACK), then ``traffic``."""

    def __init__(self, hello: bytes, subscription: bytes | None = None) -> None:
        self.hello = hello
        self.subscription = subscription
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.rest = b""
        self.handshaking = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.hello)  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"closed before it was ready: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        READS[0] += 1
        buf = self.rest + data if self.rest else data
        if self.handshaking:
            buf = self.handshake(buf)
        self.rest = self.traffic(buf) if buf else b""

    def handshake(self, buf: bytes) -> bytes:
        frames, used = walk(buf)
        for first, start, end in frames:
            kind = first & 0xF0
            if (kind == CONNACK and buf[start + 1]) or (kind == SUBACK and buf[end - 1] >= 0x80):
                self.ready.set_exception(ConnectionError(f"refused: {buf[start - 2:end].hex()}"))
                return b""
            if kind == SUBACK or (kind == CONNACK and self.subscription is None):
                self.handshaking = False
                self.ready.set_result(None)
                return buf[end:]
            if kind == CONNACK:
                assert self.transport is not None and self.subscription is not None
                self.transport.write(self.subscription)
        return buf[used:]

    def traffic(self, buf: bytes) -> bytes:
        """Handles what came after the handshake; returns the unfinished packet's bytes."""
        return buf[walk(buf)[1]:]


class Subscriber(Client):
    """Counts PUBLISHes and acknowledges QoS 1 ones; marks the window's start and end (``on_mark``); with
    ``stamped`` payloads it records each message's latency after the first ``skip`` ones."""

    def __init__(self, hello: bytes, subscription: bytes, marks: tuple[int, int], on_mark: Callable[[int], None],
                 stamped: bool = False) -> None:
        super().__init__(hello, subscription)
        self.received = 0
        self.marks = list(marks)
        self.skip = marks[0]
        self.on_mark = on_mark
        self.stamped = stamped
        self.latencies_ns: list[int] = []
        self.head = b""
        self.size = 0
        self.id_at = 0

    def traffic(self, buf: bytes) -> bytes:
        count = uniform_run(buf, self.head, self.size) if self.size and not self.stamped else 0
        if count:
            whole = count * self.size
            if self.id_at:
                strided = bytearray(b"\x40\x02\x00\x00" * count)
                strided[2::4] = buf[self.id_at:whole:self.size]
                strided[3::4] = buf[self.id_at + 1:whole:self.size]
                self.transport.write(strided)  # type: ignore[union-attr]
            self.count(count)
            return buf[whole:]
        frames, used = walk(buf)
        acks: list[bytes] = []
        now = time.monotonic_ns()
        count = 0
        for first, start, end in frames:
            if first & 0xF0 != PUBLISH:
                continue
            count += 1
            id_at = start + 2 + (buf[start] << 8 | buf[start + 1])
            if first & 0x06:
                acks.append(b"\x40\x02" + buf[id_at:id_at + 2])
                if not self.size and end - start < 128:  # learn the common frame: its head and size
                    self.head, self.size, self.id_at = buf[start - 2:start], end - start + 2, id_at - start + 2
            elif not self.size and end - start < 128:
                self.head, self.size = buf[start - 2:start], end - start + 2
            if self.stamped and self.received + count > self.skip:
                self.latencies_ns.append(now - int.from_bytes(buf[end - 8:end], "big"))
        if acks:
            self.transport.write(b"".join(acks))  # type: ignore[union-attr]
        self.count(count)
        return buf[used:]

    def count(self, count: int) -> None:
        self.received += count
        while self.marks and self.received >= self.marks[0]:
            self.on_mark(self.marks.pop(0))


class Publisher(Client):
    """QoS 0: writes chunks of identical PUBLISHes while the transport takes them. QoS 1: keeps ``window``
    unacknowledged, refilled once per loop turn; with ``rate`` (messages/s) it sends what is due every
    millisecond instead, each stamped with its send time."""

    def __init__(self, hello: bytes, topic: str, payload_size: int, qos: int, window: int = 64,
                 rate: float | None = None) -> None:
        super().__init__(hello)
        self.qos = qos
        self.window = window
        self.rate = rate
        self.sent = 0
        self.acked = 0
        self.running = False
        self.paused = False
        self.refill_due = False
        payload = bytes(payload_size)
        if qos == 0:
            one = publish(topic, payload, 0)
            self.frame_size = len(one)
            self.per_chunk = max(1, FLOOD_CHUNK // len(one))
            self.chunk = one * self.per_chunk
        else:
            frames = [publish(topic, payload, 1, packet_id) for packet_id in range(1, ID_RING + 1)]
            self.frame_size = len(frames[0])
            self.ring = b"".join(frames) * 2  # a run of ids never needs to wrap
        self.started = 0.0

    def start(self) -> None:
        self.running = True
        self.started = time.monotonic()
        if self.rate is not None:
            self.tick()
        elif self.qos == 0:
            self.flood()
        else:
            self.send(self.window)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.qos == 0:
            self.flood()

    def flood(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        for _ in range(8):
            if self.paused or not self.running:
                return
            transport.write(self.chunk)
            self.sent += self.per_chunk
        asyncio.get_running_loop().call_soon(self.flood)

    def send(self, count: int) -> None:
        if count <= 0 or not self.running or self.transport is None or self.transport.is_closing():
            return
        at = (self.sent % ID_RING) * self.frame_size
        frames = self.ring[at:at + count * self.frame_size]
        if self.rate is not None:  # stamp every frame's last 8 bytes
            stamp = time.monotonic_ns().to_bytes(8, "big")
            size = self.frame_size
            frames = b"".join(frames[index:index + size - 8] + stamp for index in range(0, len(frames), size))
        self.transport.write(frames)
        self.sent += count

    def traffic(self, buf: bytes) -> bytes:
        count = uniform_run(buf, b"\x40\x02", 4)
        if count:
            rest = buf[count * 4:]
        else:
            frames, used = walk(buf)
            count = sum(1 for first, _, _ in frames if first & 0xF0 == PUBACK)
            rest = buf[used:]
        self.acked += count
        if count and self.rate is None and not self.refill_due:
            self.refill_due = True
            asyncio.get_running_loop().call_soon(self.refill)
        return rest

    def refill(self) -> None:
        self.refill_due = False
        self.send(self.window - (self.sent - self.acked))

    def tick(self) -> None:
        if not self.running:
            return
        assert self.rate is not None
        due = int((time.monotonic() - self.started) * self.rate) - self.sent
        self.send(min(due, self.window - (self.sent - self.acked)))
        asyncio.get_running_loop().call_later(0.001, self.tick)


# -- one measurement ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Load:
    """What one round puts on a broker."""

    qos: int
    publishers: int = 4
    payload: int = 64
    window: int = 64
    messages: int = 100_000
    warmup: int = 20_000
    durable: bool = False
    rate: float | None = None


@dataclass(slots=True)
class Result:
    """One round on one broker: messages/s at the subscriber, CPU seconds of the broker, of this process and
    of everything else in the window, and latencies (paced rounds)."""

    rate: float
    seconds: float
    messages: int
    broker_cpu: float
    generator_cpu: float
    other_cpu: float
    reads: int
    latencies_ns: list[int] = field(default_factory=list)

    def cpu_us(self, seconds: float) -> float:
        return seconds / max(1, self.messages) * 1e6


def cpu_seconds(pid: int) -> float:
    """A process's CPU time, all threads, to the nanosecond (``/proc/PID/task/*/schedstat``; psutil's
    ``cpu_times`` counts 10 ms ticks, too coarse for a one-second window)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except FileNotFoundError:  # a thread that ended
            continue
    return total / 1e9


#: Reads by every client of this process (``data_received`` calls): messages per read shows whether the
#: generator works per read or per message.
READS = [0]


def reads() -> int:
    return READS[0]


class Marks:
    """CPU clocks read when the subscriber passes its start and end marks."""

    def __init__(self, broker: psutil.Process) -> None:
        self.broker = broker
        self.readings: list[tuple[float, float, float, float, int]] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def __call__(self, mark: int) -> None:
        machine = psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        self.readings.append((time.monotonic(), cpu_seconds(self.broker.pid), time.process_time(), busy, reads()))
        if len(self.readings) == 2 and not self.done.done():
            self.done.set_result(None)


async def measure(host: str, port: int, broker: psutil.Process, load: Load, tag: str) -> Result:
    """Connect one subscriber and ``load.publishers`` publishers, run until the subscriber has passed its
    end mark (paced: for the warm-up and measured counts at the given rate), close everything."""
    loop = asyncio.get_running_loop()
    topic = f"light/{tag}"
    marks = Marks(broker)
    qos = load.qos
    subscriber = Subscriber(
        connect(f"{tag}-sub", receive_maximum=load.window if qos else None, session_expiry=60 if load.durable else 0),
        subscribe(topic, qos), (load.warmup, load.warmup + load.messages), marks, stamped=load.rate is not None)
    clients: list[Client] = [subscriber]
    try:
        await loop.create_connection(lambda: subscriber, host, port)
        await asyncio.wait_for(subscriber.ready, STEP_TIMEOUT)
        publishers = [Publisher(connect(f"{tag}-pub{index}"), topic, load.payload, qos, load.window, load.rate)
                      for index in range(load.publishers)]
        for publisher in publishers:
            clients.append(publisher)
            await loop.create_connection(lambda: publisher, host, port)  # noqa: B023 - awaited at once
            await asyncio.wait_for(publisher.ready, STEP_TIMEOUT)
        for publisher in publishers:
            publisher.start()
        lost = [client.closed for client in clients]
        await asyncio.wait([marks.done, *lost], timeout=STEP_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if not marks.done.done():
            raise RuntimeError(f"{tag}: {subscriber.received:,} messages received, a connection closed or timed out")
    finally:
        for client in clients:
            if isinstance(client, Publisher):
                client.running = False
            if client.transport is not None:
                client.transport.close()
        await asyncio.wait([client.closed for client in clients if client.transport is not None], timeout=10)
    (t0, broker0, self0, busy0, reads0), (t1, broker1, self1, busy1, reads1) = marks.readings
    seconds = t1 - t0
    broker_cpu, generator_cpu = broker1 - broker0, self1 - self0
    return Result(load.messages / seconds, seconds, load.messages, broker_cpu, generator_cpu,
                  max(0.0, busy1 - busy0 - broker_cpu - generator_cpu), reads1 - reads0, subscriber.latencies_ns)


def loads(messages: int, latency_seconds: float) -> dict[str, Load]:
    return {
        "qos0_fanin": Load(0, messages=messages, warmup=messages // 5),
        "qos1": Load(1, messages=messages, warmup=messages // 5),
        "qos1_durable": Load(1, messages=messages, warmup=messages // 5, durable=True),
        "qos1_latency": Load(1, publishers=1, messages=int(2000 * latency_seconds), warmup=1000, rate=2000.0),
    }


# -- the report --------------------------------------------------------------------------------------------


def summary(name: str, result: Result) -> dict[str, float]:
    """The figures of a round, by key."""
    figures = {"cpu_us": result.cpu_us(result.broker_cpu), "generator_us": result.cpu_us(result.generator_cpu),
               "generator_share": 100 * result.generator_cpu / result.seconds,
               "per_read": result.messages / max(1, result.reads)}
    if name == "qos1_latency":
        samples = sorted(result.latencies_ns)
        figures["p50_ms"] = samples[len(samples) // 2] / 1e6
        figures["p99_ms"] = samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1e6
    else:
        figures["rate"] = result.rate
    return figures


ROWS = (  # key, label, format, the target on ours/mosquitto (higher is better unless noted)
    ("rate", "msgs/s", "{:,.0f}"),
    ("cpu_us", "broker CPU us per message", "{:.2f}"),
    ("p50_ms", "p50 ms", "{:.3f}"),
    ("p99_ms", "p99 ms", "{:.3f}"),
    ("generator_share", "generator CPU, % of a core", "{:.0f}"),
    ("generator_us", "generator CPU us per message", "{:.2f}"),
    ("per_read", "messages per generator read", "{:.2f}"),
)
TARGETS = {("qos0_fanin", "rate"): ">= 2", ("qos1", "rate"): ">= 1.5", ("qos1_durable", "rate"): ">= 1",
           ("qos1_latency", "p99_ms"): "<= 1"}


def cell(fmt: str, values: list[float]) -> str:
    text = fmt.format(statistics.median(values))
    return text + (f" ({fmt.format(min(values))}-{fmt.format(max(values))})" if len(values) > 1 else "")


def table(collected: dict[str, dict[str, dict[str, list[float]]]]) -> str:
    lines = ["| scenario | figure | ours | mosquitto | ours/mosquitto | issue 30 |", "|---|---|---|---|---|---|"]
    for name, by_broker in collected.items():
        for key, label, fmt in ROWS:
            ours, theirs = by_broker["ours"].get(key), by_broker["mosquitto"].get(key)
            if not ours or not theirs:
                continue
            ratio = statistics.median(ours) / statistics.median(theirs)
            lines.append(f"| {name} | {label} | {cell(fmt, ours)} | {cell(fmt, theirs)} | {ratio:.2f} | "
                         f"{TARGETS.get((name, key), '')} |")
    return "\n".join(lines)


def pin(pid: int, cpu: int) -> None:
    """Every thread of process ``pid`` on ``cpu`` only (``taskset -a -p``); threads it starts later
    inherit it."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(task), {cpu})
        except ProcessLookupError:  # a thread that ended
            continue


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per scenario and broker (alternating)")
    parser.add_argument("--messages", type=int, default=100_000, help="messages counted per throughput round")
    parser.add_argument("--latency-seconds", type=float, default=5.0, help="seconds measured at 2,000 msgs/s")
    parser.add_argument("--pin", action="store_true", help="each broker on --broker-cpu, the generator on --generator-cpu")
    parser.add_argument("--broker-cpu", type=int, default=1, help="with --pin: the CPU of every broker (default 1)")
    parser.add_argument("--generator-cpu", type=int, default=0, help="with --pin: the generator's CPU (default 0)")
    args = parser.parse_args(argv)
    if args.pin and (args.broker_cpu == args.generator_cpu
                     or not {args.broker_cpu, args.generator_cpu} <= os.sched_getaffinity(0)):
        parser.error(f"--pin needs two different CPUs this process may use ({sorted(os.sched_getaffinity(0))})")
    args.only = [name for name in args.only.split(",") if name]
    if set(args.only) - set(SCENARIOS):
        parser.error(f"unknown scenario; choose from {', '.join(SCENARIOS)}")
    return args


async def run(targets: dict[str, tuple[str, int, psutil.Process]], args: argparse.Namespace) -> str:
    collected: dict[str, dict[str, dict[str, list[float]]]] = {}
    plan = loads(args.messages, args.latency_seconds)
    for name in [scenario for scenario in SCENARIOS if scenario in args.only]:
        by_broker: dict[str, dict[str, list[float]]] = {"ours": {}, "mosquitto": {}}
        collected[name] = by_broker
        names = ["ours", "mosquitto-persistent" if name == "qos1_durable" else "mosquitto"]
        for round_number in range(args.rounds):
            for broker in names if round_number % 2 == 0 else names[::-1]:
                host, port, process = targets[broker]
                tag = f"{name}-{round_number}-{time.monotonic_ns()}"
                result = await measure(host, port, process, plan[name], tag)
                figures = summary(name, result)
                for key, value in figures.items():
                    by_broker[broker.split("-")[0]].setdefault(key, []).append(value)
                shown = ", ".join(f"{key} {value:,.2f}" if value < 100 else f"{key} {value:,.0f}"
                                  for key, value in figures.items())
                print(f"{name} round {round_number + 1} {broker}: {shown}; other processes "
                      f"{100 * result.other_cpu / result.seconds:.0f} % of a core; load average "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
    return table(collected)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pinning = f"brokers pinned to CPU {args.broker_cpu}, generator to CPU {args.generator_cpu}" if args.pin else "not pinned"
    print(f"broker_light: {', '.join(args.only)}; {args.rounds} round(s); {psutil.cpu_count()} cores, {pinning}; "
          f"load average {' '.join(f'{value:.2f}' for value in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-light-") as tmp, \
            brokers(Path(tmp), persistent="qos1_durable" in args.only) as every:
        targets = {"ours": every[0], "mosquitto": every[1], **({"mosquitto-persistent": every[2]} if len(every) > 2 else {})}
        if args.pin:
            for target in every:
                pin(target.process.pid, args.broker_cpu)
            pin(os.getpid(), args.generator_cpu)
        report = uvloop.run(run({name: (t.host, t.port, t.process) for name, t in targets.items()}, args))
    print(f"\nload average at the end {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    if max(os.getloadavg()) > (psutil.cpu_count() or 1):
        print("(not a quiet machine: the throughput ratios are the scheduler's; read the CPU us per message rows)")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
