"""Resident memory of idle MQTT connections: our gateway side by side with Debian's mosquitto.

    .venv/bin/python bench/idle_connections.py                      # 2,000 and 10,000 connections, 3 rounds
    .venv/bin/python bench/idle_connections.py --counts 2000 --rounds 1

For every count and round, both brokers are started fresh (our gateway as shipped: ``appliance run`` with
the embedded default configuration, state store and firmware service included), and one broker after the
other, alternating which goes first, gets ``count`` MQTT connections from two separate processes
(``bench/mqtt_load.py``'s connectors: CONNECT with a client id of its own, keep-alive 60 s, no
subscriptions, then nothing). While every connection is open the script reads each broker's resident set
size (RSS, from ``/proc`` through psutil) and prints it, the RSS of the idle broker before the first
connection, the bytes each connection added, and the ratio ours/mosquitto. The last table holds the
medians (min-max over rounds) and the bounds of issue 30 (2,000 connections <= 48 MB, 10,000 <= 150 MB).

RSS does not depend on how fast the machine is, so the figures hold on a loaded machine too; what they
depend on is the allocator's state, which is why every round starts a fresh broker.

The exit status is 1 if a connection was refused or a bound was missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

if __package__ in (None, ""):  # run by path: make ``bench`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mqtt_load import MQTT_5, MQTT_311, Schedule, WorkerSpec, raise_fd_limit, run_load  # noqa: E402
from testing.processes import GatewayProcess, MosquittoProcess  # noqa: E402

#: Issue 30's bounds on our gateway's RSS, in MB, by number of idle connections.
RSS_BOUNDS_MB = {2000: 48.0, 10000: 150.0}
#: Seconds a fresh broker is left alone before its idle RSS is read (start-up work settles).
SETTLE_SECONDS = 1.0
BROKERS = ("ours", "mosquitto")


@dataclass(frozen=True, slots=True)
class Sample:
    """One broker, one round: RSS idle and with every connection open, in bytes."""

    idle: int
    connected: int
    count: int

    @property
    def per_connection(self) -> float:
        return (self.connected - self.idle) / self.count


@contextmanager
def fresh_broker(name: str, work_dir: Path) -> Iterator[tuple[str, int, psutil.Process]]:
    """Start one broker on an OS-chosen port: host, port and its process while it runs."""
    server: GatewayProcess | MosquittoProcess
    if name == "ours":
        server = GatewayProcess(data_dir=work_dir / "gateway", port=0)
    else:
        server = MosquittoProcess(work_dir / "mosquitto")
    with server:
        assert server.process is not None
        yield server.host, server.port, psutil.Process(server.process.pid)


def measure(name: str, count: int, version: int) -> tuple[Sample, list[str]]:
    """``count`` idle connections to a fresh broker ``name``; its RSS before and while they are open."""
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp, fresh_broker(name, Path(tmp)) as (host, port, process):
        time.sleep(SETTLE_SECONDS)
        idle = process.memory_info().rss
        rss = 0

        def on_event(event: str) -> None:
            nonlocal rss
            if event == "connected":
                rss = process.memory_info().rss

        halves = [count // 2 + count % 2, count // 2]
        specs = [WorkerSpec("connector", host, port, part, f"idle{index}", version=version)
                 for index, part in enumerate(halves) if part]
        results = run_load(specs, Schedule(warmup=0.0, duration=0.0), on_event)
        connected = sum(result.connected for result in results)
        errors = [f"{name}: {error}" for result in results for error in result.errors][:5]
        if connected < count:
            errors.append(f"{name}: only {connected} of {count} connections were accepted")
        return Sample(idle, rss, count), errors


def _mb(value: float) -> str:
    return f"{value / 2**20:.1f}"


def _cell(values: list[float], fmt: str = "{:.1f}") -> str:
    text = fmt.format(statistics.median(values))
    if len(values) > 1:
        text += f" ({fmt.format(min(values))}-{fmt.format(max(values))})"
    return text


def table(samples: dict[int, dict[str, list[Sample]]]) -> tuple[str, bool]:
    """The Markdown summary and whether every bound was met."""
    lines = [
        "| idle MQTT connections | ours RSS, MB | mosquitto RSS, MB | ratio ours/mosquitto | ours idle / per connection | "
        "mosquitto idle / per connection | bound |",
        "|---|---|---|---|---|---|---|",
    ]
    met = True
    for count, by_broker in samples.items():
        ours = [s.connected / 2**20 for s in by_broker["ours"]]
        theirs = [s.connected / 2**20 for s in by_broker["mosquitto"]]
        ratio = statistics.median(ours) / statistics.median(theirs)
        bound = RSS_BOUNDS_MB.get(count)
        verdict = ""
        if bound is not None:
            ok = statistics.median(ours) <= bound
            met = met and ok
            verdict = f"<= {bound:g}: {'ok' if ok else 'MISSED'}"
        per = {name: (_cell([s.idle / 2**20 for s in by_broker[name]]) + " MB / "
                      + _cell([s.per_connection for s in by_broker[name]], "{:,.0f}") + " B") for name in BROKERS}
        lines.append(f"| {count:,} | {_cell(ours)} | {_cell(theirs)} | {ratio:.2f} | {per['ours']} | {per['mosquitto']} | "
                     f"{verdict} |")
    return "\n".join(lines), met


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--counts", default="2000,10000", help="comma-separated connection counts (default 2000,10000)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh brokers per count (default 3)")
    parser.add_argument("--mqtt", choices=("3.1.1", "5"), default="5", help="protocol level of every client")
    args = parser.parse_args(argv)
    args.counts = [int(part) for part in args.counts.split(",") if part.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    version = MQTT_5 if args.mqtt == "5" else MQTT_311
    limit = raise_fd_limit()  # before the brokers start: they inherit it
    needed = max(args.counts) + 100
    if limit < needed:
        print(f"the open-files limit is {limit}, {max(args.counts):,} connections need about {needed:,}: "
              f"raise the hard limit (ulimit -Hn {needed}) and run again", file=sys.stderr)
        return 2
    print(f"bench: idle MQTT {args.mqtt} connections {', '.join(f'{c:,}' for c in args.counts)}; {args.rounds} round(s); "
          f"{psutil.cpu_count()} cores, load average {psutil.getloadavg()[0]:.1f}", flush=True)
    samples: dict[int, dict[str, list[Sample]]] = {}
    failed = False
    for count in args.counts:
        samples[count] = {name: [] for name in BROKERS}
        for round_number in range(args.rounds):
            order = BROKERS if round_number % 2 == 0 else BROKERS[::-1]
            for name in order:
                sample, errors = measure(name, count, version)
                samples[count][name].append(sample)
                print(f"{count:,} connections round {round_number + 1} {name}: RSS {_mb(sample.connected)} MB "
                      f"(idle {_mb(sample.idle)} MB, {sample.per_connection:,.0f} B per connection)", flush=True)
                for error in errors:
                    failed = True
                    print(f"  error: {error}", flush=True)
    summary, met = table(samples)
    print()
    print(summary)
    return 1 if failed or not met else 0


if __name__ == "__main__":
    sys.exit(main())
