"""A fixed, deterministic in-process workload for ``valgrind --tool=callgrind --cache-sim=yes``: the
broker core's work per message at a low rate, in instructions and cache misses, which the load of a
shared machine does not change (issue 30, session 14).

    valgrind --tool=callgrind --cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=1048576,16,64 \\
        --collect-atstart=no --toggle-collect=_operator_call --callgrind-out-file=/tmp/cg.out \\
        .venv/bin/python bench/wake_workload.py --turns 300
    callgrind_annotate /tmp/cg.out | head -20      # Ir, I1mr, D1mr, DLmr, ...: divide by the messages

One publisher and one subscriber (MQTT 5, QoS 1, 64-byte payload, a throwaway ``broker.db``) on the
real ``Broker`` through in-memory links (``bench/broker_core.py``'s). Each turn is what one paced
message costs: the publisher's read of ``--per-read`` PUBLISHes and its flush, then the subscriber's read
of the PUBACKs and its flush, each after the caches were evicted (``broker_core.evict_caches`` over
``--evict-bytes``, 4 MiB: four times the simulated last-level cache, which is a Raspberry Pi 4's L2).
Only the broker's calls are counted: each runs inside ``operator.call``, whose C function
``_operator_call`` toggles callgrind's collection on and off, while the cache simulation runs
throughout. ``--evict-bytes 0`` leaves the evictions out (warm).

``--loop`` leaves the flush to the event loop, as the gateway does (a read that scheduled one gets it from
``call_soon`` in the loop's next iteration), so what a read costs in the loop itself counts too. That
part runs outside ``operator.call``: run callgrind with ``--collect-atstart=yes`` at two turn counts and
divide the difference of the totals by the difference of the turns (the script's own work per turn is the
same in every tree, so the difference between two trees is the broker's):

    valgrind --tool=callgrind --cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=1048576,16,64 \\
        --callgrind-out-file=/tmp/cg-300.out .venv/bin/python bench/wake_workload.py --loop --turns 300
    # and --turns 600; then (Ir(600) - Ir(300)) / 300 per turn (a PUBLISH read and a PUBACK read)

``--sockets --callgrind`` counts the whole wake-up instead, as the gateway runs it (issue 30, session 16):
the broker behind a real listener (``transport.server.start_listener``: ``ClientProtocol`` on uvloop's
transport), the publisher and the subscriber on real loopback sockets that the script drives itself,
outside the loop. Each turn the script evicts the caches, sends the publisher's PUBLISH and turns
callgrind's collection on (a client request, ``CALLGRIND_TOGGLE_COLLECT``, from a small C library
compiled for the run), and turns it off in the loop's next ready callback, once the broker has answered:
what is counted is everything the process runs between the two, that is uvloop's poll, libuv's read,
``get_buffer``/``buffer_updated``, the broker, the writes and their system calls' user-space side, and
the loop's return to its next iteration. The same for the subscriber's PUBACK. It runs the process
twice under callgrind (``--measure publish``, then ``puback``) and prints per read: the totals and the
functions with the most last-level misses, inclusive and self, instruction misses apart from data misses.
The broker's once-a-second tick is stopped and the clients send keep-alive 0, so no timer of the broker
falls into a counted wake-up (at 2,000 msgs/s they run once per 2,000 wake-ups).

    .venv/bin/python bench/wake_workload.py --sockets --callgrind --turns 200 --per-read 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import operator
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

if __package__ in (None, ""):  # run by path: make ``appliance`` and ``bench`` importable from this tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.broker.broker import Broker  # noqa: E402
from appliance.broker.codec import packets as pk  # noqa: E402
from appliance.broker.codec.reader import PacketReader  # noqa: E402
from appliance.broker.codec.writer import encode  # noqa: E402
from appliance.broker.config import LimitsConfig, ListenerConfig  # noqa: E402
from appliance.broker.transport.server import start_listener  # noqa: E402
from bench.broker_core import TOPIC, WINDOW, MemoryLink, connect, evict_caches, settled, started_broker  # noqa: E402
from bench.minimal_relay import RelayProtocol  # noqa: E402

#: The caches callgrind simulates, a Raspberry Pi 4's: (size, associativity, line) of I1, D1 and the last level.
CACHES = {"I1": "32768,8,64", "D1": "32768,8,64", "LL": "1048576,16,64"}
#: What the tables show: instructions, then instruction misses (L1, last level), then data misses.
SHOWN_EVENTS = ("Ir", "I1mr", "ILmr", "D1mr", "D1mw", "DLmr", "DLmw")
#: The client request that turns callgrind's collection on and off, built for the run (``--callgrind``).
TOGGLE_SOURCE = "#include <valgrind/callgrind.h>\nvoid collect_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"
#: Turns before the counted ones (the caches, the route cache and the allocator settle).
SOCKET_WARMUP_TURNS = 30


def handle_read(broker: Broker, link: MemoryLink, data: bytes, loop_flush: bool) -> Awaitable[None] | None:
    """One read; its flush at once or, with ``loop_flush``, the loop's turn that runs it (the awaitable)."""
    if loop_flush:
        broker.data_received(link, data)
        return asyncio.sleep(0)
    operator.call(handle, broker, link, data)
    return None


def handle(broker: Broker, link: MemoryLink, data: bytes) -> None:
    """One read and the flush after it: what the measurement counts (inside ``operator.call``)."""
    broker.data_received(link, data)
    broker.flush()


async def run(turns: int, per_read: int, evict_bytes: int, loop_flush: bool = False) -> int:
    """Returns the messages sent through the broker."""
    junk = bytearray(evict_bytes)
    delivered = 0
    async with started_broker(LimitsConfig(max_inflight_messages=WINDOW)) as broker:
        subscriber = connect(broker, "sub", pk.Subscribe(1, [pk.SubscribeRequest(TOPIC, 1)]), properties={0x21: WINDOW})
        publisher = connect(broker, "pub")
        await settled(broker, subscriber, publisher)
        payload = b"x" * 64
        packet_id = 0
        for _ in range(turns):
            chunks = []
            for _ in range(per_read):
                packet_id = packet_id % 65535 + 1
                chunks.append(encode(pk.Publish(TOPIC, payload, 1, packet_id=packet_id), pk.MQTT_5))
            data = b"".join(chunks)
            if evict_bytes:
                evict_caches(junk)
            turn = handle_read(broker, publisher, data, loop_flush)
            if turn is not None:
                await turn
            publisher.take()
            subscriber.take()
            # The broker numbers its deliveries 1, 2, 3, ... (the window never fills): the acknowledgements
            # are encoded without decoding what it sent, without a decoder's work between two reads.
            ids = [(delivered + index) % 65535 + 1 for index in range(per_read)]
            acks = b"".join(encode(pk.PubAck(packet_id), pk.MQTT_5) for packet_id in ids)
            if evict_bytes:
                evict_caches(junk)
            turn = handle_read(broker, subscriber, acks, loop_flush)
            if turn is not None:
                await turn
            delivered += len(ids)
            await asyncio.sleep(0)
    return delivered


async def client(port: int, client_id: str, *packets: pk.Packet) -> tuple[socket.socket, PacketReader]:
    """A real MQTT 5 client socket (keep-alive 0, Receive Maximum ``WINDOW``), connected and answered
    (its CONNACK and one reply per packet of ``packets`` read); the script drives it outside the loop."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    connect_packet = pk.Connect(pk.MQTT_5, client_id, True, 0, properties={0x21: WINDOW})
    await loop.sock_sendall(sock, b"".join(encode(packet, pk.MQTT_5) for packet in (connect_packet, *packets)))
    reader = PacketReader(1 << 20)
    reader.protocol_level = pk.MQTT_5
    replies: list[pk.Packet] = []
    while len(replies) < 1 + len(packets):
        replies += reader.feed(await loop.sock_recv(sock, 65536))
    return sock, reader


class SocketTurns:
    """The turns of ``--sockets``, as a chain of the loop's ready callbacks (see the module docstring): a
    step sends one read's bytes, turns collection on if that kind of read is measured and schedules the
    next step, which the loop runs in its next iteration, after the poll that delivered the bytes to the
    broker; that step turns collection off once the broker's answer is there (or waits one more
    iteration, counted, as ``retries``)."""

    def __init__(self, acknowledged: Callable[[], bool], publisher: socket.socket, subscriber: socket.socket,
                 reader: PacketReader, turns: int, per_read: int, measure: str, toggle: Callable[[], None]) -> None:
        #: Whether the target has handled the subscriber's PUBACKs.
        self.settled = acknowledged
        self.publisher = publisher
        self.subscriber = subscriber
        self.reader = reader
        self.turns = turns
        self.per_read = per_read
        self.measure = measure
        self.toggle = toggle
        self.junk = bytearray(4 << 20)
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        self.turn = 0
        self.packet_id = 0
        self.measured = 0
        self.retries = 0
        self.pending_acks = b""
        self.counting = False

    def _send(self, sock: socket.socket | None, data: bytes, kind: str, then: Callable[[], None]) -> None:
        """Evict, send ``data`` (nothing with ``sock`` None: the ``empty`` kind), count from here if
        ``kind`` is measured, and run ``then`` in the loop's next iteration."""
        evict_caches(self.junk)
        if sock is not None:
            sock.send(data)
        self.loop.call_soon(then)
        self.counting = self.turn >= SOCKET_WARMUP_TURNS and kind == self.measure
        if self.counting:
            self.measured += 1
            self.toggle()

    def empty(self) -> None:
        """An iteration with no read, measured alone (``empty``): what the script's toggling and the loop's
        iteration cost by themselves."""
        self._stop_counting()
        self.publish(after_empty=True)

    def _stop_counting(self) -> None:
        if self.counting:
            self.toggle()
            self.counting = False

    def publish(self, after_empty: bool = False) -> None:
        if self.turn == SOCKET_WARMUP_TURNS + self.turns:
            self.done.set_result(None)
            return
        if self.measure == "empty" and not after_empty:
            self._send(None, b"", "empty", self.empty)
            return
        chunks = []
        for _ in range(self.per_read):
            self.packet_id = self.packet_id % 65535 + 1
            chunks.append(encode(pk.Publish(TOPIC, b"x" * 64, 1, packet_id=self.packet_id), pk.MQTT_5))
        self._send(self.publisher, b"".join(chunks), "publish", self.delivered)

    def delivered(self) -> None:
        """The PUBLISH read's answer: the deliveries at the subscriber, the PUBACKs at the publisher."""
        self._stop_counting()
        try:
            packets = self.reader.feed(self.subscriber.recv(65536))
        except BlockingIOError:
            packets = []
        ids = [packet.packet_id or 0 for packet in packets if isinstance(packet, pk.Publish)]
        self.pending_acks += b"".join(encode(pk.PubAck(packet_id), pk.MQTT_5) for packet_id in ids)
        acknowledged = len(self.pending_acks) // 4
        if acknowledged < self.per_read:
            self._look_again("publish", self.delivered)
            return
        while True:  # the publisher's PUBACKs, not looked at
            try:
                self.publisher.recv(65536)
            except BlockingIOError:
                break
        acks, self.pending_acks = self.pending_acks, b""
        self._send(self.subscriber, acks, "puback", self.acknowledged)

    def _look_again(self, kind: str, callback: Callable[[], None]) -> None:
        """The broker's answer is not all there yet: count on (if this turn counts ``kind`` reads) and look
        again in the loop's next iteration."""
        self.retries += 1
        self.counting = self.turn >= SOCKET_WARMUP_TURNS and self.measure == kind
        if self.counting:
            self.toggle()
        self.loop.call_soon(callback)

    def acknowledged(self) -> None:
        """The PUBACK read's effect: nothing in flight to the subscriber any more."""
        self._stop_counting()
        if not self.settled():
            self._look_again("puback", self.acknowledged)
            return
        self.turn += 1
        self.loop.call_soon(self.publish)


async def run_sockets(turns: int, per_read: int, measure: str, toggle: Callable[[], None], relay: bool) -> tuple[int, int]:
    """``--sockets``: returns the reads counted and the extra loop iterations counted with them. With
    ``relay``, the target is ``bench/minimal_relay.py``'s protocol instead of the broker: the floor of a
    wake-up in Python on uvloop (it ignores PUBACKs, so their read is over with the loop iteration)."""
    async with contextlib.AsyncExitStack() as stack:
        if relay:
            subscribers: list[RelayProtocol] = []
            server = await asyncio.get_running_loop().create_server(lambda: RelayProtocol(subscribers), "127.0.0.1", 0)
            gc.freeze()

            def acknowledged() -> bool:
                return True
        else:
            broker = await stack.enter_async_context(started_broker(LimitsConfig(max_inflight_messages=WINDOW)))
            if broker._tick_timer is not None:
                broker._tick_timer.cancel()
            server, _url = await start_listener(broker, ListenerConfig("tcp", "127.0.0.1", 0))

            def acknowledged() -> bool:
                return not broker.sessions["sub"].inflight
        port = server.sockets[0].getsockname()[1]
        subscriber, reader = await client(port, "sub", pk.Subscribe(1, [pk.SubscribeRequest(TOPIC, 1)]))
        publisher, _ = await client(port, "pub")
        turns_driver = SocketTurns(acknowledged, publisher, subscriber, reader, turns, per_read, measure, toggle)
        asyncio.get_running_loop().call_soon(turns_driver.publish)
        await turns_driver.done
        publisher.close()
        subscriber.close()
        server.close()
    return turns_driver.measured, turns_driver.retries


def annotate(output: Path, inclusive: bool) -> list[tuple[list[int], str, str]]:
    """Every function of a callgrind output: (its counts of ``SHOWN_EVENTS``, its name, its object file)."""
    text = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
                           f"--show={','.join(SHOWN_EVENTS)}", "--sort=ILmr,DLmr,DLmw,Ir", "--threshold=100", str(output)],
                          check=True, capture_output=True, text=True).stdout
    count = r"(?:[\d,]+(?: \( ?[\d.]+%\))?|\.)\s+"
    rows = []
    for line in text.splitlines():
        found = re.match(r"^\s*((?:" + count + "){" + str(len(SHOWN_EVENTS)) + r"})(\S.*)$", line)
        if found is None or "PROGRAM TOTALS" in line or "file:function" in line:
            continue
        values = [int(value.replace(",", "")) if value != "." else 0 for value in re.findall(r"([\d,]+|\.)(?: \( ?[\d.]+%\))?\s+",
                                                                                              found.group(1))]
        named = re.match(r"^(.*?)(?: \[(.*)\])?$", found.group(2).strip())
        assert named is not None
        rows.append((values, named.group(1).rsplit("/", 1)[-1], Path(named.group(2) or "?").name))
    return rows


def last_level_misses(values: list[int]) -> int:
    return values[SHOWN_EVENTS.index("ILmr")] + values[SHOWN_EVENTS.index("DLmr")] + values[SHOWN_EVENTS.index("DLmw")]


def table(rows: list[tuple[list[int], str]], reads: int) -> str:
    header = "| " + " | ".join(SHOWN_EVENTS) + " | |\n|" + "---:|" * len(SHOWN_EVENTS) + "---|\n"
    return header + "\n".join("| " + " | ".join(f"{value / reads:,.0f}" for value in values) + f" | {name} |"
                               for values, name in rows)


def callgrind_sockets(turns: int, per_read: int, top: int, kinds: list[str], relay: bool) -> int:
    """``--sockets --callgrind``: the socket workload under callgrind once per kind of read (and once for
    the script's own part, ``empty``); prints the tables."""
    for tool in ("valgrind", "gcc", "callgrind_annotate"):
        if shutil.which(tool) is None:
            raise SystemExit(f"--callgrind needs {tool} (apt-get install valgrind gcc)")
    with tempfile.TemporaryDirectory(prefix="bench-wake-") as tmp:
        source = Path(tmp) / "toggle.c"
        source.write_text(TOGGLE_SOURCE)
        library = Path(tmp) / "toggle.so"
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
        for kind in kinds:
            output = Path(tmp) / f"callgrind-{kind}.out"
            run = subprocess.run(
                ["valgrind", "--tool=callgrind", "--cache-sim=yes", *(f"--{name}={value}" for name, value in CACHES.items()),
                 "--collect-atstart=no", f"--callgrind-out-file={output}", sys.executable, str(Path(__file__).resolve()),
                 "--sockets", "--measure", kind, "--toggle-library", str(library), "--turns", str(turns),
                 "--per-read", str(per_read), *(["--relay"] if relay else [])],
                check=True, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            found = re.search(r"(\d+) reads counted, (\d+) extra loop iterations", run.stdout)
            if found is None:
                raise SystemExit(f"no count in the workload's output: {run.stdout}{run.stderr}")
            reads, retries = int(found.group(1)), int(found.group(2))
            self_rows = annotate(output, False)
            totals = [sum(values[index] for values, _, _ in self_rows) for index in range(len(SHOWN_EVENTS))]
            label = {"empty": "the script's own part: an empty loop iteration between the two toggles",
                     "publish": f"{per_read} PUBLISH{'es' if per_read > 1 else ''}",
                     "puback": "its PUBACK" if per_read == 1 else "their PUBACKs"}[kind]
            print(f"\n### {kind} read ({label}), {reads} reads counted ({retries} extra loop iterations)\n")
            print(table([(totals, "total per read")], reads))
            by_object: dict[str, list[int]] = {}
            for values, _, obj in self_rows:
                summed = by_object.setdefault(obj, [0] * len(SHOWN_EVENTS))
                for index, value in enumerate(values):
                    summed[index] += value
            print("\nself, by object file:\n")
            print(table(sorted(((values, obj) for obj, values in by_object.items()), key=lambda row: -last_level_misses(row[0])),
                        reads))
            print(f"\nself, the {top} functions with the most last-level misses (ILmr + DLmr + DLmw):\n")
            print(table(sorted(((values, name) for values, name, _ in self_rows), key=lambda row: -last_level_misses(row[0]))[:top],
                        reads))
            inner = [(values, name) for values, name, _ in annotate(output, True) if values[0] < 0.9 * totals[0]]
            print(f"\ninclusive, the {top} functions with the most last-level misses, under 90 % of the total's instructions:\n")
            print(table(sorted(inner, key=lambda row: -last_level_misses(row[0]))[:top], reads))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--per-read", type=int, default=1, help="PUBLISHes per read (1: one message per wake-up)")
    parser.add_argument("--evict-bytes", type=int, default=4 << 20, help="bytes touched before each read (0: warm)")
    parser.add_argument("--loop", action="store_true", help="the flush runs from the event loop (see the docstring)")
    parser.add_argument("--sockets", action="store_true", help="the whole wake-up over real sockets (see the docstring)")
    parser.add_argument("--callgrind", action="store_true", help="with --sockets: run under callgrind, print the tables")
    parser.add_argument("--top", type=int, default=25, help="with --callgrind: functions per table")
    parser.add_argument("--relay", action="store_true", help="with --sockets: bench/minimal_relay.py instead of the broker")
    parser.add_argument("--kinds", default="empty,publish,puback", help="with --callgrind: the reads to count")
    parser.add_argument("--measure", choices=("empty", "publish", "puback"), help=argparse.SUPPRESS)
    parser.add_argument("--toggle-library", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sockets and args.callgrind:
        return callgrind_sockets(args.turns, args.per_read, args.top, args.kinds.split(","), args.relay)
    if args.sockets:
        toggle: Callable[[], None] = ctypes.CDLL(args.toggle_library).collect_toggle if args.toggle_library else lambda: None
        reads, retries = uvloop.run(run_sockets(args.turns, args.per_read, args.measure or "publish", toggle, args.relay))
        print(f"{reads} reads counted, {retries} extra loop iterations")
        return 0
    delivered = uvloop.run(run(args.turns, args.per_read, args.evict_bytes, args.loop))
    print(f"{delivered} messages delivered in {args.turns} turns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
