"""What one QoS 1 message costs the broker core, in-process: CPU microseconds and Python bytecodes.

    .venv/bin/python bench/broker_core.py                  # QoS 1 4->1, window 64
    .venv/bin/python bench/broker_core.py --durable        # the same to a durable subscriber (broker.db)
    .venv/bin/python bench/broker_core.py --opcodes        # bytecodes per message, per function
    .venv/bin/python bench/broker_core.py --fanout --opcodes   # QoS 0 1->100: bytecodes per delivery
    .venv/bin/python bench/broker_core.py --durable --statements   # SQLite's share, by statement

Why it exists: ``bench/broker.py`` is the figure that counts, but on the shared 2-core machine one run's
throughput swings 2-3x from round to round, so a 10 % regression of the per-message path cannot be seen
there. This drives the real ``Broker`` (real codec, sessions, router, ``broker.db``, the asyncio runtime
on uvloop) through in-memory links instead of sockets: 4 publishers send ``--per-publisher`` QoS 1
PUBLISHes each per turn (a publisher held back by the broker sends nothing), the subscriber acknowledges
everything it got, and only the broker's calls are timed (thread CPU time, so other processes' load
counts less). ``min block`` is the cheapest of the 100-turn blocks, the figure least touched by the
machine's load. ``--opcodes`` counts the bytecodes the broker executes per message instead (slow, but
exact and independent of the load: compare two trees with it). ``--fanout`` measures issue 13's other
shape instead: one publisher, QoS 0, ``FANOUT_SUBSCRIBERS`` subscribers of the topic, figures per
delivery (one message to one subscriber). ``--statements`` also times every ``sqlite3`` call of the
store by statement (thread CPU time, its ``execute``/``executemany`` only: the rows' buffering is the
broker's). No syscalls are measured: the socket
writes and SQLite's own work below Python are not in these figures.

``--cold`` measures what a wake-up costs at a low rate (issue 30's 2,000 msgs/s, where every read is a
wake-up of its own): one publisher sends ``--per-read`` PUBLISHes per read (2, as the paced latency load
does), and before every read of the broker (the PUBLISHes, then the subscriber's PUBACKs) the
caches are flushed by touching ``COLD_BYTES`` and running some unrelated Python, as the other processes
do between two wake-ups on a real machine. It prints the median CPU per read, cold and warm (the same
reads without the flush, in the first half of the turns): the difference is what the per-message path costs for being executed cold.
A read is timed as the loop runs it (``wake_up``): ``data_received``, then the loop's turn, which runs the
flush if the read scheduled one. ``--cold --opcodes`` counts the bytecodes of the broker's calls per read
of each kind instead (the paced shape, one publisher; the default shape has four publishers per turn).
Under ``--opcodes`` every read takes much longer than ``broker.QUIET_READ_GAP``, so with several
publishers per turn each read looks alone in its turn and is written at its end: compare trees with
several publishers per turn with that gap raised.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop

if __package__ in (None, ""):  # run by path: make ``appliance`` importable from this tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.broker.broker import Broker  # noqa: E402
from appliance.broker.codec import packets as pk  # noqa: E402
from appliance.broker.codec.reader import PacketReader  # noqa: E402
from appliance.broker.codec.writer import encode  # noqa: E402
from appliance.broker.config import BrokerConfig, LimitsConfig, ListenerConfig  # noqa: E402
from appliance.broker.persistence.store import BrokerStore  # noqa: E402
from appliance.broker.security.auth import Authenticator  # noqa: E402
from appliance.broker.sessions.session import ClientConnection  # noqa: E402

PUBLISHERS = 4
WINDOW = 64
TOPIC = "bench/core"
BLOCK_TURNS = 100
FANOUT_SUBSCRIBERS = 100
#: Bytes touched between two reads in ``--cold`` mode: more than a last-level cache.
COLD_BYTES = 32 << 20


class MemoryLink:
    """The socket layer's side of one connection, in memory: what the broker writes is kept."""

    def __init__(self, broker: Broker) -> None:
        limits = broker.limits
        self.connection = ClientConnection(limits.max_packet_size, limits.topic_alias_maximum, "memory")
        self.connection.link = self
        self.written: list[bytes] = []
        self.holds: set[str] = set()

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        pass

    def hold_reading(self, reason: str, held: bool) -> None:
        (self.holds.add if held else self.holds.discard)(reason)

    def peer_closed(self) -> bool:
        return False

    def unread_input(self) -> bool:
        return False

    def take(self) -> bytes:
        data = b"".join(self.written)
        self.written.clear()
        return data


class StatementTimer:
    """The store's ``sqlite3`` connection, with each ``execute``/``executemany`` timed by statement (thread
    CPU seconds and calls, keyed by the statement's first 40 characters)."""

    def __init__(self) -> None:
        #: Set when the store is open (``started_broker``).
        self.connection: sqlite3.Connection
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)

    def execute(self, statement: str, parameters: Any = ()) -> sqlite3.Cursor:
        started = time.thread_time()
        cursor = self.connection.execute(statement, parameters)
        self._count(statement, started)
        return cursor

    def executemany(self, statement: str, rows: Any) -> sqlite3.Cursor:
        started = time.thread_time()
        cursor = self.connection.executemany(statement, rows)
        self._count(statement, started)
        return cursor

    def _count(self, statement: str, started: float) -> None:
        key = statement[:40]
        self.seconds[key] += time.thread_time() - started
        self.calls[key] += 1


class OpcodeCounter:
    """Counts the bytecodes executed while enabled, per (file, function)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        frame.f_trace_opcodes = True
        key = (Path(frame.f_code.co_filename).name, frame.f_code.co_name)
        counts = self.counts

        def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
            if event == "opcode":
                counts[key] += 1
            return local
        return local

    def __enter__(self) -> None:
        sys.settrace(self._trace)

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


@contextlib.asynccontextmanager
async def started_broker(limits: LimitsConfig | None = None,
                         statements: StatementTimer | None = None) -> AsyncIterator[Broker]:
    """A broker on a throwaway broker.db, its start-up heap frozen as the gateway does; with
    ``statements``, its connection is timed (``StatementTimer.connection`` is set here)."""
    with tempfile.TemporaryDirectory(prefix="bench-core-") as tmp:
        store = BrokerStore.open(Path(tmp) / "broker.db")
        if statements is not None:
            statements.connection = store._db
            store._db = statements  # type: ignore[assignment]
        config = BrokerConfig((ListenerConfig("tcp", "memory", 0),), limits=limits or LimitsConfig())
        broker = Broker(config, store, Authenticator(None, True), None)
        await broker.start()
        gc.freeze()
        try:
            yield broker
        finally:
            await broker.stop()
            store.close()


def connect(broker: Broker, client_id: str, *packets: Any, properties: dict[int, Any] | None = None) -> MemoryLink:
    """An MQTT 5 client connected in memory, with ``packets`` sent right after its CONNECT."""
    link = MemoryLink(broker)
    broker.connection_made(link)
    data = encode(pk.Connect(pk.MQTT_5, client_id, True, 60, properties=properties or {}), pk.MQTT_5)
    broker.data_received(link, data + b"".join(encode(packet, pk.MQTT_5) for packet in packets))
    return link


async def settled(broker: Broker, *links: MemoryLink) -> PacketReader:
    """Lets the broker answer the CONNECTs and SUBSCRIBEs, drops what it sent, and returns the MQTT 5
    reader that decodes what the subscribers get from then on."""
    await asyncio.sleep(0)
    broker.flush()
    for link in links:
        link.take()
    reader = PacketReader(1 << 20)
    reader.protocol_level = pk.MQTT_5
    return reader


@dataclass
class Blocks:
    """The broker's CPU time per message (or delivery) over each block of ``BLOCK_TURNS`` turns: the
    median of blocks, not one average, so a block that a collection or the load slowed stands apart."""

    seconds: float = 0.0  # of the block so far
    units: int = 0
    per_unit: list[float] = field(default_factory=list)  # microseconds, one per finished block

    def count(self, turn: int, units: int) -> None:
        self.units += units
        if turn % BLOCK_TURNS == 0 and self.units:
            self.per_unit.append(self.seconds / self.units * 1e6)
            self.seconds, self.units = 0.0, 0


async def run(turns: int, per_publisher: int, durable: bool, opcodes: OpcodeCounter | None,
              statements: StatementTimer | None = None) -> tuple[int, list[float]]:
    """Returns the messages delivered and the CPU microseconds per message of each block of turns."""
    async with started_broker(LimitsConfig(max_inflight_messages=WINDOW), statements) as broker:
        subscriber_properties = {0x21: WINDOW, **({0x11: 3600} if durable else {})}
        subscriber = connect(broker, "sub", pk.Subscribe(1, [pk.SubscribeRequest(TOPIC, 1)]),
                             properties=subscriber_properties)
        publishers = [connect(broker, f"pub{index}") for index in range(PUBLISHERS)]
        reader = await settled(broker, subscriber, *publishers)
        payload = b"x" * 64
        packet_id = 0
        delivered = 0
        blocks = Blocks()
        for turn in range(1, turns + 1):
            reads = []
            for link in publishers:
                data = bytearray()
                for _ in range(0 if link.holds else per_publisher):
                    packet_id = packet_id % 65535 + 1
                    data += encode(pk.Publish(TOPIC, payload, 1, packet_id=packet_id), pk.MQTT_5)
                reads.append((link, bytes(data)))
            started = time.thread_time()
            with opcodes or contextlib.nullcontext():
                for link, chunk in reads:
                    if chunk:
                        broker.data_received(link, chunk)
                broker.flush()
            blocks.seconds += time.thread_time() - started
            for link in publishers:
                link.take()
            ids = [p.packet_id for p in reader.feed(subscriber.take()) if isinstance(p, pk.Publish)]
            acks = b"".join(encode(pk.PubAck(packet_id or 0), pk.MQTT_5) for packet_id in ids)
            started = time.thread_time()
            with opcodes or contextlib.nullcontext():
                if acks:
                    broker.data_received(subscriber, acks)
                broker.flush()
            blocks.seconds += time.thread_time() - started
            delivered += len(ids)
            blocks.count(turn, len(ids))
            await asyncio.sleep(0)  # what the broker scheduled (backlogs, its own flush) runs, untimed
    return delivered, blocks.per_unit


async def run_fanout(turns: int, per_turn: int, opcodes: OpcodeCounter | None) -> tuple[int, list[float]]:
    """QoS 0 1->``FANOUT_SUBSCRIBERS``: returns the deliveries and the CPU microseconds per delivery of each block."""
    async with started_broker() as broker:
        subscribers = [connect(broker, f"sub{index}", pk.Subscribe(1, [pk.SubscribeRequest(TOPIC, 0)]))
                       for index in range(FANOUT_SUBSCRIBERS)]
        publisher = connect(broker, "pub")
        reader = await settled(broker, publisher, *subscribers)
        burst = encode(pk.Publish(TOPIC, b"x" * 64, 0), pk.MQTT_5) * per_turn
        delivered = 0
        blocks = Blocks()
        for turn in range(1, turns + 1):
            started = time.thread_time()
            with opcodes or contextlib.nullcontext():
                if not publisher.holds:
                    broker.data_received(publisher, burst)
                broker.flush()
            blocks.seconds += time.thread_time() - started
            publisher.take()
            deliveries = sum(isinstance(packet, pk.Publish) for link in subscribers for packet in reader.feed(link.take()))
            delivered += deliveries
            blocks.count(turn, deliveries)
            await asyncio.sleep(0)
    return delivered, blocks.per_unit


def evict_caches(junk: bytearray) -> None:
    """Touch every cache line of ``junk`` and run some unrelated Python (dicts, lists, a sort): what
    other processes leave behind in the caches between two wake-ups."""
    junk[::64] = bytes(len(junk) // 64)
    churn = {str(index): [index] * 3 for index in range(2000)}
    sorted(churn.items(), key=lambda item: -item[1][0])


async def wake_up(broker: Broker, link: MemoryLink, data: bytes, opcodes: OpcodeCounter | None) -> None:
    """One read as the loop runs it: ``data_received``, then the loop turn until it is idle again (the
    flush the read scheduled, if it scheduled one). Counting bytecodes, only the broker's calls are
    counted: ``data_received`` and that flush, called directly."""
    if opcodes is None:
        broker.data_received(link, data)
        await asyncio.sleep(0)
        return
    with opcodes:
        broker.data_received(link, data)
        if broker._flush_scheduled:
            broker.flush()


async def run_cold(turns: int, per_read: int,
                   opcodes: dict[str, OpcodeCounter] | None = None) -> dict[str, list[float]]:
    """One publisher, ``per_read`` QoS 1 PUBLISHes per read, one subscriber acknowledging each read's
    deliveries in one read. Returns the CPU microseconds of each read (``wake_up``: the handling, the
    loop turn and the flush) by kind: ``publish``/``puback``, each ``warm`` (the first half of the turns)
    and ``cold`` (caches evicted before it: the second half). With ``opcodes``, each kind's bytecodes are
    counted instead (by ``opcodes[kind]``; the caches are left alone)."""
    junk = bytearray(COLD_BYTES if opcodes is None else 0)
    times: dict[str, list[float]] = {f"{kind} {state}": [] for state in ("cold", "warm") for kind in ("publish", "puback")}
    async with started_broker(LimitsConfig(max_inflight_messages=WINDOW)) as broker:
        subscriber = connect(broker, "sub", pk.Subscribe(1, [pk.SubscribeRequest(TOPIC, 1)]), properties={0x21: WINDOW})
        publisher = connect(broker, "pub")
        reader = await settled(broker, subscriber, publisher)
        payload = b"x" * 64
        packet_id = 0
        for turn in range(turns):
            state = "cold" if turn >= turns // 2 else "warm"
            chunks = []
            for _ in range(per_read):
                packet_id = packet_id % 65535 + 1
                chunks.append(encode(pk.Publish(TOPIC, payload, 1, packet_id=packet_id), pk.MQTT_5))
            if state == "cold":
                evict_caches(junk)
            started = time.thread_time()
            await wake_up(broker, publisher, b"".join(chunks), opcodes["publish"] if opcodes else None)
            times[f"publish {state}"].append((time.thread_time() - started) * 1e6)
            publisher.take()
            ids = [p.packet_id for p in reader.feed(subscriber.take()) if isinstance(p, pk.Publish)]
            acks = b"".join(encode(pk.PubAck(packet_id or 0), pk.MQTT_5) for packet_id in ids)
            if state == "cold":
                evict_caches(junk)
            started = time.thread_time()
            await wake_up(broker, subscriber, acks, opcodes["puback"] if opcodes else None)
            times[f"puback {state}"].append((time.thread_time() - started) * 1e6)
            await asyncio.sleep(0)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--durable", action="store_true", help="the subscriber's session outlives it (broker.db)")
    parser.add_argument("--fanout", action="store_true",
                        help=f"QoS 0 from one publisher to {FANOUT_SUBSCRIBERS} subscribers, figures per delivery")
    parser.add_argument("--per-publisher", type=int, default=32,
                        help="PUBLISHes per publisher and turn (32: the queue behind the window is used, as in bench/broker.py)")
    parser.add_argument("--turns", type=int, help="turns (default 3,000; with --opcodes 300)")
    parser.add_argument("--opcodes", action="store_true", help="count bytecodes per message instead of timing")
    parser.add_argument("--top", type=int, default=30, help="functions listed with --opcodes")
    parser.add_argument("--statements", action="store_true", help="also time the store's SQLite calls by statement")
    parser.add_argument("--cold", action="store_true",
                        help="CPU per read at a low rate: one publisher, caches evicted before each read")
    parser.add_argument("--per-read", type=int, default=2, help="with --cold: PUBLISHes per read (2: the paced latency load)")
    args = parser.parse_args(argv)
    if args.cold and args.opcodes:
        counters = {kind: OpcodeCounter() for kind in ("publish", "puback")}
        turns = args.turns or 300
        uvloop.run(run_cold(turns, args.per_read, counters))
        for kind, counter in counters.items():
            print(f"{kind} read ({f'{args.per_read} PUBLISHes' if kind == 'publish' else 'their PUBACKs'}): "
                  f"{sum(counter.counts.values()) / turns:.1f} bytecodes per read")
            for (file, function), count in counter.counts.most_common(args.top):
                print(f"  {count / turns:7.2f}  {file}:{function}")
        return 0
    if args.cold:
        per_read = args.per_read
        times = uvloop.run(run_cold(args.turns or 2000, per_read))
        for key, values in times.items():
            ordered = sorted(values)
            print(f"{key}: {len(ordered):,} reads of {per_read if key.startswith('publish') else 'the'} "
                  f"{'PUBLISHes' if key.startswith('publish') else 'PUBACKs'}, broker CPU per read: median "
                  f"{ordered[len(ordered) // 2]:.1f} us (p10 {ordered[len(ordered) // 10]:.1f}, p90 {ordered[len(ordered) * 9 // 10]:.1f})")
        return 0
    turns = args.turns or (300 if args.opcodes else 3000)
    counter = OpcodeCounter() if args.opcodes else None
    statements = StatementTimer() if args.statements else None
    if args.fanout:
        delivered, blocks = uvloop.run(run_fanout(turns, args.per_publisher, counter))
    else:
        delivered, blocks = uvloop.run(run(turns, args.per_publisher, args.durable, counter, statements))
    kind = "fanout" if args.fanout else "durable" if args.durable else "qos1"
    unit, units = ("delivery", "deliveries") if args.fanout else ("message", "messages")
    if counter is not None:
        print(f"{kind}: {delivered:,} {units}, {sum(counter.counts.values()) / delivered:.1f} bytecodes per {unit}")
        for (file, function), count in counter.counts.most_common(args.top):
            print(f"  {count / delivered:7.2f}  {file}:{function}")
        return 0
    ordered = sorted(blocks)
    print(f"{kind}: {delivered:,} {units}, broker CPU per {unit}: min block {ordered[0]:.2f} us, "
          f"median {ordered[len(ordered) // 2]:.2f} us")
    if statements is not None:
        print(f"  SQLite, us per message: {sum(statements.seconds.values()) / delivered * 1e6:.2f}")
        for key, seconds in statements.seconds.most_common():
            print(f"  {seconds / delivered * 1e6:7.2f}  {statements.calls[key]:6,} calls  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
