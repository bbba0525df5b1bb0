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
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import sys
from collections.abc import Awaitable
from pathlib import Path

import uvloop

if __package__ in (None, ""):  # run by path: make ``appliance`` and ``bench`` importable from this tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.broker.broker import Broker  # noqa: E402
from appliance.broker.codec import packets as pk  # noqa: E402
from appliance.broker.codec.writer import encode  # noqa: E402
from appliance.broker.config import LimitsConfig  # noqa: E402
from bench.broker_core import TOPIC, WINDOW, MemoryLink, connect, evict_caches, settled, started_broker  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--per-read", type=int, default=1, help="PUBLISHes per read (1: one message per wake-up)")
    parser.add_argument("--evict-bytes", type=int, default=4 << 20, help="bytes touched before each read (0: warm)")
    parser.add_argument("--loop", action="store_true", help="the flush runs from the event loop (see the docstring)")
    args = parser.parse_args(argv)
    delivered = uvloop.run(run(args.turns, args.per_read, args.evict_bytes, args.loop))
    print(f"{delivered} messages delivered in {args.turns} turns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
