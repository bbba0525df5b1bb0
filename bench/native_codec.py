"""What compiling the codec or the broker's per-message path with mypyc would save, measured without installing it.

    .venv/bin/python bench/native_codec.py                       # the codec: 3 rounds of bench/broker_core.py, each tree in turn
    .venv/bin/python bench/native_codec.py --durable --rounds 5
    .venv/bin/python bench/native_codec.py --core --cold         # the per-message path: CPU per read, cold and warm
    .venv/bin/python bench/native_codec.py --core --callgrind    # instructions and cache misses per message (valgrind)
    .venv/bin/python bench/native_codec.py --core --wake-floor   # bench/wake_floor.py in each tree: latency against mosquitto

Issue 30, goal 4: if the per-message floor of the pure-Python broker is not enough, which part of the hot
path would have to leave Python, and what would it buy? This copies ``appliance`` and ``bench`` into a
temporary folder, compiles modules there with mypyc from the same source, and measures this tree and the
compiled copy in turn. Two sets:

- the codec (``CODEC``: framing, PUBLISH and PUBACK parsing, the writer; session 9);
- with ``--core``, the per-message path together (``CORE``: codec, dispatch, handlers, routing, the
  session window, the broker core, the ACL; session 14). Left interpreted: ``packets`` (its dataclasses'
  class attribute ``type`` loses its ``ClassVar`` in mypyc's dataclass support and becomes a field; with
  ``type`` as a property it compiles and measured the same), ``sessions/no_queue`` (a compiled ``deque``
  subclass crashes), the store's SQLite I/O, the socket layer and the runtime.

Figures: by default ``min block`` of ``bench/broker_core.py`` (warm, batched); ``--cold`` the medians of
``bench/broker_core.py --cold`` (a wake-up's read with the caches evicted, and the same warm);
``--callgrind`` a fixed workload (the cold one: 100 turns of warm-up, then 200 turns of 2 PUBLISHes and
their PUBACKs, caches evicted before every read, or not with ``--warm``) under ``valgrind --tool=callgrind
--cache-sim=yes``, counting only the broker's calls (they go through ``operator.call``, and collection is
toggled on that C function): instructions and I1, D1 and last-level misses per message. Those do not
depend on the machine's load. The simulated caches are a Raspberry Pi 4's sizes (32 KiB L1s, 1 MiB L2 as
the last level) rather than this machine's, whose 32 MiB L3 the 32 MiB eviction would not empty.
``--wake-floor`` runs ``bench/wake_floor.py`` (the gateway at 2,000 msgs/s beside mosquitto and the
minimal relay, one round each time) in each tree in turn, and prints ours / mosquitto: CPU per message,
p50 and p99; on a
quiet machine only (load average under 1.5), as that script's figures are.

Needs a C compiler and the Python headers (gcc and python3-dev on Debian) and mypy (the ``test``
extra); ``--callgrind`` needs valgrind. Nothing is installed: the gateway and every test keep using the
pure-Python source.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
CODEC = tuple(f"appliance/broker/codec/{name}.py" for name in ("reader", "writer", "properties", "reasons"))
CORE = (
    *CODEC,
    *(f"appliance/broker/handlers/{name}.py" for name in ("dispatch", "publish", "subscribe", "connect")),
    *(f"appliance/broker/routing/{name}.py" for name in ("delivery", "message", "router", "topic_tree", "edge_tree", "retain")),
    *(f"appliance/broker/sessions/{name}.py" for name in ("session", "backpressure", "lifecycle")),
    "appliance/broker/context.py",
    "appliance/broker/broker.py",
    "appliance/broker/security/acl.py",
    "appliance/broker/transport/connection.py",
    "appliance/broker/persistence/store_failure.py",
)
MIN_BLOCK = re.compile(r"min block ([0-9.]+) us")
COLD_MEDIAN = re.compile(r"^(\w+ \w+): .* median ([0-9.]+) us", re.MULTILINE)
#: A row of ``bench/wake_floor.py``'s table (CPU us per message, latency ms): ours, mosquitto, the relay.
WAKE_ROW = re.compile(r"^\| (cpu us|p50 ms|p99 ms) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", re.MULTILINE)
#: The caches callgrind simulates: (size, associativity, line) of I1, D1 and the last level.
CACHES = {"I1": "32768,8,64", "D1": "32768,8,64", "LL": "1048576,16,64"}
CALLGRIND_EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
WORKLOAD_WARMUP, WORKLOAD_TURNS, WORKLOAD_PER_READ = 100, 200, 2


def compile_copy(target: Path, modules: tuple[str, ...]) -> None:
    """``appliance`` and ``bench`` copied to ``target``, ``modules`` compiled in place there (the compile's
    time is printed)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    shutil.copytree(ROOT / "appliance", target / "appliance", ignore=ignore)
    shutil.copytree(ROOT / "bench", target / "bench", ignore=ignore)
    shutil.copytree(ROOT / "testing", target / "testing", ignore=ignore)  # the gateway bench/ starts runs from its tree
    mypyc = Path(sys.executable).with_name("mypyc")
    before = psutil.Process().cpu_times()
    started = time.monotonic()
    subprocess.run([str(mypyc), *modules], cwd=target, check=True, capture_output=True)
    wall = time.monotonic() - started
    after = psutil.Process().cpu_times()
    cpu = after.children_user + after.children_system - before.children_user - before.children_system
    print(f"compiled {len(modules)} modules in {wall:.0f} s ({cpu:.0f} s of CPU)", flush=True)
    check = "import appliance.broker.codec.reader as r; print(r.__file__)"
    loaded = subprocess.run([sys.executable, "-c", check], cwd=target, check=True, capture_output=True, text=True)
    if not loaded.stdout.strip().endswith(".so"):
        raise SystemExit(f"the compiled reader is not the one imported: {loaded.stdout.strip()}")


def broker_core(tree: Path, extra: list[str]) -> str:
    return subprocess.run([sys.executable, str(tree / "bench" / "broker_core.py"), *extra], cwd=tree,
                          check=True, capture_output=True, text=True).stdout


def cpu_per_message(tree: Path, extra: list[str]) -> float:
    output = broker_core(tree, extra)
    found = MIN_BLOCK.search(output)
    if found is None:
        raise SystemExit(f"no figure in bench/broker_core.py's output: {output}")
    return float(found.group(1))


def cold_medians(tree: Path) -> dict[str, float]:
    """``bench/broker_core.py --cold``'s medians, us per read: ``publish cold``, ``puback warm``..."""
    output = broker_core(tree, ["--cold"])
    found = {name: float(value) for name, value in COLD_MEDIAN.findall(output)}
    if len(found) != 4:
        raise SystemExit(f"no figures in bench/broker_core.py --cold's output: {output}")
    return found


def wake_floor(tree: Path, seconds: float) -> dict[str, tuple[float, float]]:
    """One round of ``bench/wake_floor.py`` run in ``tree``: (ours, mosquitto) CPU us per message and ms at
    p50 and p99."""
    output = subprocess.run([sys.executable, str(tree / "bench" / "wake_floor.py"), "--rounds", "1", "--seconds", str(seconds)],
                            cwd=tree, check=True, capture_output=True, text=True).stdout
    rows = {name: (float(ours), float(mosquitto)) for name, ours, mosquitto, _relay in WAKE_ROW.findall(output)}
    if len(rows) != 3:
        raise SystemExit(f"no latency figures in bench/wake_floor.py's output: {output}")
    return rows


def callgrind(tree: Path, warm: bool, output: Path) -> dict[str, float]:
    """The broker's events per message in the fixed workload (``workload``), run in ``tree``."""
    command = ["valgrind", "--tool=callgrind", "--cache-sim=yes", *(f"--{name}={value}" for name, value in CACHES.items()),
               "--collect-atstart=no", "--toggle-collect=_operator_call", f"--callgrind-out-file={output}",
               sys.executable, str(tree / "bench" / "native_codec.py"), "--workload", "warm" if warm else "cold"]
    run = subprocess.run(command, cwd=tree, check=True, capture_output=True, text=True)
    messages = int(re.search(r"messages measured: (\d+)", run.stderr).group(1))  # type: ignore[union-attr]
    totals = re.search(r"^(?:summary|totals):((?: \d+)+)", output.read_text(), re.MULTILINE)
    if totals is None:
        raise SystemExit(f"no totals in {output}")
    counts = [int(value) for value in totals.group(1).split()]
    return {event: count / messages for event, count in zip(CALLGRIND_EVENTS, counts, strict=True)}


async def workload(cold: bool) -> None:
    """The fixed workload ``--callgrind`` runs under valgrind: ``bench/broker_core.py --cold``'s reads,
    the measured ones (only) called through ``operator.call``."""
    import broker_core as bc  # this script's folder, in whichever tree it runs

    from appliance.broker.codec import packets as pk
    from appliance.broker.codec.writer import encode
    from appliance.broker.config import LimitsConfig

    junk = bytearray(bc.COLD_BYTES)
    delivered = 0
    async with bc.started_broker(LimitsConfig(max_inflight_messages=bc.WINDOW)) as broker:
        subscriber = bc.connect(broker, "sub", pk.Subscribe(1, [pk.SubscribeRequest(bc.TOPIC, 1)]), properties={0x21: bc.WINDOW})
        publisher = bc.connect(broker, "pub")
        reader = await bc.settled(broker, subscriber, publisher)
        packet_id = 0
        for turn in range(WORKLOAD_WARMUP + WORKLOAD_TURNS):
            measured = turn >= WORKLOAD_WARMUP
            chunks = []
            for _ in range(WORKLOAD_PER_READ):
                packet_id = packet_id % 65535 + 1
                chunks.append(encode(pk.Publish(bc.TOPIC, b"x" * 64, 1, packet_id=packet_id), pk.MQTT_5))
            for link, data in ((publisher, b"".join(chunks)), (subscriber, None)):
                if data is None:  # the subscriber acknowledges what it got, in one read
                    ids = [p.packet_id for p in reader.feed(subscriber.take()) if isinstance(p, pk.Publish)]
                    data = b"".join(encode(pk.PubAck(packet_id or 0), pk.MQTT_5) for packet_id in ids)
                    delivered += len(ids) if measured else 0
                if cold and measured:
                    bc.evict_caches(junk)
                if measured:
                    operator.call(broker.data_received, link, data)
                    operator.call(broker.flush)
                else:
                    broker.data_received(link, data)
                    broker.flush()
            publisher.take()
            await asyncio.sleep(0)
    print(f"broker module: {sys.modules['appliance.broker.broker'].__file__}", file=sys.stderr)
    print(f"messages measured: {delivered}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=1500)
    parser.add_argument("--durable", action="store_true", help="QoS 1 to a durable subscriber (broker.db)")
    parser.add_argument("--core", action="store_true", help="compile the per-message path (CORE), not only the codec")
    parser.add_argument("--cold", action="store_true", help="bench/broker_core.py --cold: CPU per read, cold and warm")
    parser.add_argument("--callgrind", action="store_true", help="instructions and cache misses per message under valgrind")
    parser.add_argument("--warm", action="store_true", help="with --callgrind: no cache eviction between reads")
    parser.add_argument("--wake-floor", action="store_true", help="bench/wake_floor.py in each tree: CPU, p50 and p99 against mosquitto")
    parser.add_argument("--seconds", type=float, default=5.0, help="with --wake-floor: seconds per round")
    parser.add_argument("--workload", choices=("cold", "warm"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workload:
        import uvloop

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        uvloop.run(workload(args.workload == "cold"))
        return 0
    if shutil.which("gcc") is None:
        parser.error("needs gcc and the Python headers (apt-get install gcc python3-dev)")
    if args.callgrind and shutil.which("valgrind") is None:
        parser.error("--callgrind needs valgrind (apt-get install valgrind)")
    label = "compiled path" if args.core else "compiled codec"
    with tempfile.TemporaryDirectory(prefix="bench-native-") as tmp:
        compiled = Path(tmp)
        compile_copy(compiled, CORE if args.core else CODEC)
        if args.callgrind:
            for name, tree in (("pure", ROOT), (label, compiled)):
                events = callgrind(tree, args.warm, compiled / f"callgrind-{name.replace(' ', '-')}.out")
                print(f"{name}, {'warm' if args.warm else 'cold'}, per message: "
                      + ", ".join(f"{event} {value:,.0f}" for event, value in events.items()), flush=True)
            return 0
        if args.wake_floor:
            ratios: dict[str, dict[str, list[float]]] = {"pure": {}, label: {}}
            for round_number in range(args.rounds):
                trees = (("pure", ROOT), (label, compiled))
                for name, tree in trees if round_number % 2 == 0 else trees[::-1]:
                    rows = wake_floor(tree, args.seconds)
                    for row, (ours, mosquitto) in rows.items():
                        ratios[name].setdefault(row, []).append(ours / mosquitto)
                    shown = ", ".join(f"{row} {ours:.3f} against mosquitto's {mosquitto:.3f} ({ours / mosquitto:.2f}x)"
                                      for row, (ours, mosquitto) in rows.items())
                    print(f"round {round_number + 1} {name}: {shown}; load average {psutil.getloadavg()[0]:.2f}", flush=True)
            for name, by_row in ratios.items():
                print(f"{name}: ours / mosquitto, median of {args.rounds} rounds: "
                      + ", ".join(f"{row} {statistics.median(values):.2f}x" for row, values in by_row.items()))
            return 0
        if args.cold:
            medians: dict[str, dict[str, list[float]]] = {"pure": {}, label: {}}
            for round_number in range(args.rounds):
                for name, tree in (("pure", ROOT), (label, compiled)):
                    for figure, value in cold_medians(tree).items():
                        medians[name].setdefault(figure, []).append(value)
                print(f"round {round_number + 1}: " + "; ".join(
                    f"{name} " + ", ".join(f"{figure} {values[-1]:.1f}" for figure, values in medians[name].items())
                    for name in medians) + f" us per read; load average {psutil.getloadavg()[0]:.1f}", flush=True)
            for figure in medians["pure"]:
                pure_value = statistics.median(medians["pure"][figure])
                native_value = statistics.median(medians[label][figure])
                print(f"{figure}: median of {args.rounds} runs, pure {pure_value:.1f} us, {label} {native_value:.1f} us per read "
                      f"({100 * (native_value / pure_value - 1):+.0f} %)")
            return 0
        extra = ["--turns", str(args.turns), *(["--durable"] if args.durable else [])]
        pure: list[float] = []
        native: list[float] = []
        for round_number in range(args.rounds):
            pure.append(cpu_per_message(ROOT, extra))
            native.append(cpu_per_message(compiled, extra))
            print(f"round {round_number + 1}: pure {pure[-1]:.2f} us, {label} {native[-1]:.2f} us per message; "
                  f"load average {psutil.getloadavg()[0]:.1f}", flush=True)
    best_pure, best_native = min(pure), min(native)
    print(f"{'durable' if args.durable else 'qos1'}: broker CPU per message, cheapest block of {args.rounds} runs: "
          f"pure {best_pure:.2f} us, {label} {best_native:.2f} us ({100 * (1 - best_native / best_pure):.0f} % less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
