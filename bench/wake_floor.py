"""Where a wake-up goes at 2,000 msgs/s: our gateway, mosquitto and a minimal Python relay, side by side.

    .venv/bin/python bench/wake_floor.py                     # 3 rounds each, brokers alternating, 5 s each
    .venv/bin/python bench/wake_floor.py --pin --rounds 5    # every broker on CPU 1, the generator on CPU 0
    .venv/bin/python bench/wake_floor.py --strace            # plus one round each under strace -c -f

Issue 30 asks for p99 publish-to-delivery latency at 2,000 msgs/s no worse than mosquitto's. At that rate
every read is a wake-up of its own, so what counts is the cost of one wake-up, not of one message in a
batch. This runs ``bench/broker_light.py``'s paced load (one QoS 1 publisher at 2,000 msgs/s, one
subscriber, latency from the send time stamped in the payload to the subscriber's read) against three
targets in alternating rounds:

* our gateway (``python -m appliance run``, as ``bench/broker.py`` starts it);
* mosquitto (``persistence false``);
* ``bench/minimal_relay.py``: Python on uvloop with the gateway's socket layer and next to no Python of its
  own, the floor of any broker written this way.

Per round it prints the broker's CPU per message split into user and system time (``/proc``, 10 ms
ticks, so read several rounds), the latency's minimum, p50, p90 and p99, and the load average. At the end
it pools every round's latencies per target and prints the pooled percentiles with a 90 % interval for
each target's p99 against mosquitto's, drawn by resampling whole rounds: on this kind of host a single
round's p99 swings by a third from one round to the next, for mosquitto as for us (session 15: the same
tree's p99 ratio was 0.93x in one run and 1.26x in the next), so a ratio is only shown when the interval
says so. With
``--strace`` one more round per target runs under ``strace -c -f``: system calls per message by name
(``epoll_wait``/``epoll_pwait`` per message shows whether a wake-up costs extra loop iterations).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import uvloop

if __package__ in (None, ""):  # run by path: make ``bench`` and ``testing`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.broker import Target, brokers  # noqa: E402
from bench.broker_light import Load, measure, pin  # noqa: E402
from bench.syscalls import parse_summary  # noqa: E402

RELAY = Path(__file__).resolve().with_name("minimal_relay.py")
TARGETS = ("ours", "mosquitto", "relay")


@contextmanager
def relay() -> Iterator[Target]:
    process = subprocess.Popen([sys.executable, str(RELAY)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline().split()[1])
        yield Target("relay", "127.0.0.1", port, psutil.Process(process.pid))
    finally:
        process.kill()
        process.wait(10)


#: Percentiles the pooled summary prints.
POOLED_FRACTIONS = (0.5, 0.9, 0.99, 0.999)
#: Resamples of whole rounds behind the p99 ratio's interval.
BOOTSTRAP_DRAWS = 200


def percentile(ordered: list[int], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] / 1e6


def pooled(rounds: list[list[int]]) -> list[int]:
    """Every round's latencies in one ordered list."""
    return sorted(latency for latencies in rounds for latency in latencies)


def ratio_interval(ours: list[list[int]], theirs: list[list[int]], fraction: float,
                   draws: int = BOOTSTRAP_DRAWS, seed: int = 15) -> tuple[float, float, float]:
    """The pooled ``fraction`` percentile of ``ours`` over that of ``theirs``: (5th percentile, median,
    95th percentile) over ``draws`` resamples. Whole rounds are resampled, with the same round numbers
    for both sides (round i of each ran back to back), because latencies within a round are not
    independent: a slow stretch of the host lasts for many messages."""
    picker = random.Random(seed)
    count = min(len(ours), len(theirs))
    ratios = []
    for _ in range(draws):
        picked = [picker.randrange(count) for _ in range(count)]
        ratios.append(percentile(pooled([ours[i] for i in picked]), fraction)
                      / percentile(pooled([theirs[i] for i in picked]), fraction))
    ratios.sort()
    return ratios[int(draws * 0.05)], ratios[draws // 2], ratios[min(draws - 1, int(draws * 0.95))]


async def one_round(target: Target, load: Load, tag: str) -> tuple[dict[str, float], list[int]]:
    """The figures of one paced round: CPU us per message (user, system: the whole round, warm-up
    included) and latency in ms; and the round's latencies in ns."""
    before = target.process.cpu_times()
    result = await measure(target.host, target.port, target.process, load, tag)
    after = target.process.cpu_times()
    messages = load.warmup + load.messages
    ordered = sorted(result.latencies_ns)
    return {
        "user_us": (after.user - before.user) / messages * 1e6,
        "sys_us": (after.system - before.system) / messages * 1e6,
        "cpu_us": result.cpu_us(result.broker_cpu),
        "min_ms": ordered[0] / 1e6,
        "p50_ms": percentile(ordered, 0.5),
        "p90_ms": percentile(ordered, 0.9),
        "p99_ms": percentile(ordered, 0.99),
    }, result.latencies_ns


async def strace_round(target: Target, load: Load, tag: str, output: Path) -> dict[str, float]:
    """System calls per message, by name, over a whole round (the connections' set-up is a few dozen
    calls against the round's thousands of messages)."""
    tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(target.process.pid), "-o", str(output)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.sleep(0.5)  # strace attaches to every thread
        await measure(target.host, target.port, target.process, load, tag)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
    counts = parse_summary(output.read_text() if output.exists() else "")
    messages = load.warmup + load.messages
    return {name: calls / messages for name, calls in sorted(counts.items(), key=lambda item: -item[1])}


async def run(targets: list[Target], args: argparse.Namespace, work: Path) -> None:
    load = Load(1, publishers=1, messages=int(2000 * args.seconds), warmup=1000, rate=2000.0)
    collected: dict[str, dict[str, list[float]]] = {target.name: {} for target in targets}
    latencies: dict[str, list[list[int]]] = {target.name: [] for target in targets}
    for round_number in range(args.rounds):
        for target in targets if round_number % 2 == 0 else targets[::-1]:
            figures, round_latencies = await one_round(target, load, f"wake-{target.name}-{round_number}-{os.getpid()}")
            latencies[target.name].append(round_latencies)
            for key, value in figures.items():
                collected[target.name].setdefault(key, []).append(value)
            shown = ", ".join(f"{key} {value:.3f}" if key.endswith("ms") else f"{key} {value:.1f}" for key, value in figures.items())
            print(f"round {round_number + 1} {target.name}: {shown}; load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"\nload average at the end {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    keys = list(next(iter(collected.values())))
    print("| figure, median of rounds | " + " | ".join(target.name for target in targets) + " |")
    print("|---|" + "---|" * len(targets))
    for key in keys:
        cells = [f"{statistics.median(collected[target.name][key]):.3f}" if key.endswith("ms")
                 else f"{statistics.median(collected[target.name][key]):.1f}" for target in targets]
        print(f"| {key.replace('_', ' ')} | " + " | ".join(cells) + " |")
    print(pooled_summary(latencies))
    if args.strace:
        print()
        for target in targets:
            calls = await strace_round(target, load, f"wake-strace-{target.name}-{os.getpid()}", work / f"{target.name}.strace")
            shown = ", ".join(f"{name} {per:.2f}" for name, per in calls.items() if per >= 0.01)
            print(f"system calls per message, {target.name} (under strace): {sum(calls.values()):.2f}: {shown}", flush=True)


def pooled_summary(latencies: dict[str, list[list[int]]]) -> str:
    """The pooled percentiles per target, and each target's p99 over mosquitto's with its interval."""
    names = list(latencies)
    ordered = {name: pooled(rounds) for name, rounds in latencies.items()}
    lines = ["", "| pooled over all rounds, ms | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for fraction in POOLED_FRACTIONS:
        lines.append(f"| p{fraction * 100:g} | " + " | ".join(f"{percentile(ordered[name], fraction):.3f}" for name in names) + " |")
    if "mosquitto" in latencies:
        for name in names:
            if name != "mosquitto":
                low, middle, high = ratio_interval(latencies[name], latencies["mosquitto"], 0.99)
                lines.append(f"p99 {name} / mosquitto: {middle:.3f} (90 % interval over resampled rounds {low:.3f}-{high:.3f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per target (alternating)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds measured per round at 2,000 msgs/s")
    parser.add_argument("--pin", action="store_true", help="every target on CPU 1, the generator on CPU 0")
    parser.add_argument("--strace", action="store_true", help="one more round per target under strace -c -f")
    args = parser.parse_args(argv)
    print(f"wake_floor: {args.rounds} round(s) of {args.seconds:g} s at 2,000 msgs/s; {'pinned' if args.pin else 'not pinned'}; "
          f"load average {' '.join(f'{value:.2f}' for value in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-wake-") as tmp, brokers(Path(tmp)) as every, relay() as minimal:
        targets = [*every[:2], minimal]
        if args.pin:
            for target in targets:
                pin(target.process.pid, 1)
            pin(os.getpid(), 0)
        uvloop.run(run(targets, args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
