"""Benchmark our gateway's broker side by side with Debian's mosquitto, and print the ratios.

    .venv/bin/python bench/broker.py                 # every scenario, 5 s windows, 3 rounds
    .venv/bin/python bench/broker.py --quick         # small counts, 1 s windows, one round
    .venv/bin/python bench/broker.py --only qos1,qos1_latency --duration 10

Both brokers run for the whole invocation, each under the same load from ``bench/mqtt_load.py``. The
rounds alternate which broker goes first, so a slow drift in what else the machine is doing hits both.
Every scenario line also prints the CPU the broker, the generator and everything else used during the
measuring window: a broker near 100% of a core is the bottleneck (both are single-threaded), and a big
"other" share means the figures are noisy.

Throughput on a shared machine depends on what else runs, so the throughput scenarios also report the
broker's own CPU time (user + system) per message delivered: the figure that does not depend on the load
(issue 30). A single-threaded broker that is CPU-bound on a quiet machine delivers about 1 / (CPU per
message), so the CPU ratio ours/mosquitto predicts the quiet machine's throughput ratio (inverted).

Its generator (``bench/mqtt_load.py``, several processes) is heavy against mosquitto: it answers each of
mosquitto's one-packet writes at once and took 86-94 % of a core while mosquitto ran, which on 2 cores
starves mosquitto and flatters our ratios. ``bench/broker_light.py`` runs the throughput and latency
scenarios with a light, independent generator (one uvloop process, its own MQTT 5 lines, work per read
rather than per message) and prints its CPU share beside every figure; quote that one for issue 30.

The scenarios (issue 2, "Benchmark"):

* ``connections``: 2,000 clients connect at once; seconds until the last CONNACK, broker RSS while all
  are connected. It runs first, so the RSS is that of a fresh broker, not one that has been flooded.
* ``qos0_fanin``: 4 publishers flood QoS 0, 64-byte payloads, to 1 subscriber; messages/s received.
* ``qos1``: the same with QoS 1 end to end: each publisher keeps 64 messages unacknowledged, the
  subscriber announces Receive Maximum 64 and acknowledges everything; messages/s received.
* ``qos1_durable``: ``qos1`` with a durable subscriber (a session that outlives its connection), so
  every message goes through ``broker.db`` before its PUBACK; ``--synchronous full`` adds an fsync per
  commit. It is compared with a second mosquitto that runs with ``persistence true`` (issue 30); mosquitto
  keeps such a session in memory and snapshots it, so it never waits for the disk.
* ``qos1_latency``: one publisher paced at 2,000 messages/s, QoS 1 as above; p50/p99 from the send
  time stamped in the payload to the subscriber's read.
* ``fanout``: one publisher floods QoS 0 to 100 subscribers of the same topic; deliveries/s received.
* ``qos1_latency_flood`` (not in the issue, no target): ``qos1_latency`` while 4 more publishers flood
  QoS 0 to another subscriber: does one busy client starve the others?
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

if __package__ in (None, ""):  # run by path (``make bench``): make ``bench`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mqtt_load import (  # noqa: E402
    MQTT_5,
    MQTT_311,
    Schedule,
    WorkerResult,
    WorkerSpec,
    raise_fd_limit,
    run_load,
)
from testing.processes import GatewayProcess, MosquittoProcess  # noqa: E402

#: mosquitto as the issue measures it: unlimited queues (``max_queued_messages 0``), the same 64-message
#: outbound window our QoS 1 clients ask for (its default, 20, is also what it would grant publishers as
#: Receive Maximum), and Nagle off, as asyncio does for our broker.
MOSQUITTO_CONFIG = "max_queued_messages 0\nmax_inflight_messages 64\nset_tcp_nodelay true\n"
#: Our gateway with the same 64-message outbound window (its default cap is 20, like mosquitto's).
GATEWAY_CONFIG = "[broker.limits]\nmax_inflight_messages = 64\n"

SCENARIOS = ("connections", "qos0_fanin", "qos1", "qos1_durable", "qos1_latency", "fanout", "qos1_latency_flood")


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big each load is (``--quick`` shrinks the counts that cost setup time), and the protocol level
    every client speaks."""

    connections: int
    fanout_subscribers: int
    version: int = MQTT_5
    latency_rate: float = 2000.0
    fanin_publishers: int = 4
    window: int = 64
    payload: int = 64

    @classmethod
    def full(cls) -> Sizes:
        return cls(connections=2000, fanout_subscribers=100)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(connections=200, fanout_subscribers=10)


@dataclass(slots=True)
class Target:
    """One broker under test."""

    name: str
    host: str
    port: int
    process: psutil.Process
    #: Also told of ``run_load``'s events (``bench/syscalls.py`` attaches strace for the window with it).
    on_event: Callable[[str], None] | None = None


@dataclass(slots=True)
class Usage:
    """CPU used during a measuring window, in percent of one core, and the broker's RSS at its end (queues
    that grow during a flood show up there)."""

    broker: float
    generator: float
    busiest_worker: float
    other: float
    broker_rss: int

    def __str__(self) -> str:
        cores = psutil.cpu_count() or 1
        return (f"cpu % of a core: broker {self.broker:.0f}, generator {self.generator:.0f} (busiest process "
                f"{self.busiest_worker:.0f}), other {self.other:.0f} (of {cores * 100}); broker RSS {self.broker_rss / 2**20:.0f} MB")


class Sampler:
    """Samples the broker and the whole machine at the moments ``run_load`` reports (``on_event``):
    ``rss`` is taken with every connection open, or at the end of the measuring window."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.rss = 0
        self._start: tuple[float, float, float] | None = None
        self.broker_cpu = 0.0
        self.busy_cpu = 0.0
        self.seconds = 0.0

    def __call__(self, event: str) -> None:
        if event == "connected":
            self.rss = self.process.memory_info().rss
        elif event == "window-start":
            self._start = (self._broker_cpu(), self._busy_cpu(), time.monotonic())
        elif event == "window-end" and self._start is not None:
            self.rss = self.process.memory_info().rss
            broker, busy, started = self._start
            self.broker_cpu = self._broker_cpu() - broker
            self.busy_cpu = self._busy_cpu() - busy
            self.seconds = time.monotonic() - started

    def usage(self, results: list[WorkerResult]) -> Usage:
        seconds = self.seconds or 1.0
        generator = sum(result.cpu_seconds for result in results)
        busiest = max((result.cpu_seconds for result in results), default=0.0)
        other = max(0.0, self.busy_cpu - self.broker_cpu - generator)
        return Usage(100 * self.broker_cpu / seconds, 100 * generator / seconds, 100 * busiest / seconds,
                     100 * other / seconds, self.rss)

    def _broker_cpu(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    @staticmethod
    def _busy_cpu() -> float:
        times = psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)


@dataclass(slots=True)
class Measurement:
    """One scenario on one broker: its figures by metric key, and how busy the machine was."""

    values: dict[str, float]
    note: str
    errors: list[str] = field(default_factory=list)


# -- scenarios -------------------------------------------------------------------------------------------


def _split(total: int, parts: int) -> list[int]:
    """``total`` clients over ``parts`` processes, as evenly as possible, no empty process."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def _load(target: Target, schedule: Schedule, specs: list[WorkerSpec]) -> tuple[list[WorkerResult], Sampler]:
    sampler = Sampler(target.process)
    observer = target.on_event

    def on_event(event: str) -> None:
        sampler(event)
        if observer is not None:
            observer(event)
    results = run_load(specs, schedule, on_event)
    return results, sampler


def _errors(results: list[WorkerResult]) -> list[str]:
    return [f"worker {result.index} ({result.role}): {error}" for result in results for error in result.errors]


def cpu_per_message_us(sampler: Sampler, messages: int) -> float:
    """The broker's CPU time (user + system) in the measuring window per message (or delivery), in us."""
    return sampler.broker_cpu / max(1, messages) * 1e6


def fan_in(target: Target, sizes: Sizes, schedule: Schedule, qos: int, tag: str, durable: bool = False) -> Measurement:
    """``sizes.fanin_publishers`` publishers (two processes) to one subscriber (its own process)."""
    subscriber = WorkerSpec("subscriber", target.host, target.port, 1, f"{tag}-sub", topic=f"bench/{tag}", qos=qos,
                            version=sizes.version, receive_maximum=sizes.window if qos else None, durable=durable)
    publishers = [
        WorkerSpec("publisher", target.host, target.port, count, f"{tag}-pub{index}", topic=f"bench/{tag}", qos=qos,
                   version=sizes.version, payload_size=sizes.payload, window=sizes.window)
        for index, count in enumerate(_split(sizes.fanin_publishers, 2))
    ]
    results, sampler = _load(target, schedule, [subscriber, *publishers])
    received = results[0].received / schedule.duration
    sent = sum(r.sent for r in results[1:]) / schedule.duration
    note = f"published {sent:,.0f}/s; {sampler.usage(results)}"
    cpu = cpu_per_message_us(sampler, results[0].received)
    return Measurement({tag: received, f"{tag}_cpu_us": cpu}, note, _errors(results))


def qos1_latency(target: Target, sizes: Sizes, schedule: Schedule, flood: bool = False) -> Measurement:
    """QoS 1 at a paced 2,000 msgs/s, one publisher to one subscriber. With ``flood``, four more
    publishers flood QoS 0 to another subscriber meanwhile: what a control message sees while telemetry
    saturates the broker (a broker that serves its clients fairly keeps this latency low)."""
    topic = "bench/latency"
    prefix = "latf" if flood else "lat"
    specs = [
        WorkerSpec("subscriber", target.host, target.port, 1, f"{prefix}-sub", topic=topic, qos=1,
                   version=sizes.version, receive_maximum=sizes.window, stamp=True),
        WorkerSpec("publisher", target.host, target.port, 1, f"{prefix}-pub", topic=topic, qos=1,
                   version=sizes.version, payload_size=sizes.payload, window=sizes.window, rate=sizes.latency_rate,
                   stamp=True),
    ]
    if flood:
        specs += [
            WorkerSpec("subscriber", target.host, target.port, 1, "flood-sub", topic="bench/flood", qos=0,
                       version=sizes.version),
            WorkerSpec("publisher", target.host, target.port, sizes.fanin_publishers, "flood-pub", topic="bench/flood",
                       qos=0, version=sizes.version, payload_size=sizes.payload),
        ]
    results, sampler = _load(target, schedule, specs)
    samples = sorted(results[0].latencies_us)
    if not samples:
        return Measurement({}, "no message arrived", _errors(results))
    key = "latency_flood" if flood else "latency"
    p50 = samples[len(samples) // 2] / 1000
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1000
    note = (f"{len(samples):,} samples at {results[0].received / schedule.duration:,.0f}/s, max {samples[-1] / 1000:.1f} ms, "
            f"window full for {results[1].window_full_ms} ms")
    if flood:
        note += f", flood delivered {results[2].received / schedule.duration:,.0f}/s"
    note += f"; {sampler.usage(results)}"
    return Measurement({f"{key}_p50": p50, f"{key}_p99": p99}, note, _errors(results))


def fanout(target: Target, sizes: Sizes, schedule: Schedule) -> Measurement:
    topic = "bench/fanout"
    subscribers = [
        WorkerSpec("subscriber", target.host, target.port, count, f"fan-sub{index}", topic=topic, qos=0,
                   version=sizes.version)
        for index, count in enumerate(_split(sizes.fanout_subscribers, 2))
    ]
    publisher = WorkerSpec("publisher", target.host, target.port, 1, "fan-pub", topic=topic, qos=0,
                           version=sizes.version, payload_size=sizes.payload)
    results, sampler = _load(target, schedule, [*subscribers, publisher])
    delivered = sum(r.received for r in results[:-1]) / schedule.duration
    sent = results[-1].sent / schedule.duration
    note = f"published {sent:,.0f}/s to {sizes.fanout_subscribers} subscribers; {sampler.usage(results)}"
    cpu = cpu_per_message_us(sampler, sum(r.received for r in results[:-1]))
    return Measurement({"fanout": delivered, "fanout_cpu_us": cpu}, note, _errors(results))


def connections(target: Target, sizes: Sizes, schedule: Schedule) -> Measurement:
    before = target.process.memory_info().rss
    specs = [
        WorkerSpec("connector", target.host, target.port, count, f"conn{index}-{time.monotonic_ns()}",
                   version=sizes.version)
        for index, count in enumerate(_split(sizes.connections, 2))
    ]
    results, sampler = _load(target, schedule, specs)
    connected = sum(r.connected for r in results)
    seconds = max(r.connect_seconds for r in results)
    values = {"connect_seconds": seconds, "connect_rss_mb": sampler.rss / 2**20}
    note = f"{connected} of {sizes.connections} connected; RSS before {before / 2**20:.1f} MB"
    errors = _errors(results)
    if connected < sizes.connections:
        errors.append(f"only {connected} of {sizes.connections} connections were accepted")
    return Measurement(values, note, errors[:5])


RUNNERS: dict[str, Callable[[Target, Sizes, Schedule], Measurement]] = {
    "connections": connections,
    "qos0_fanin": lambda t, s, sch: fan_in(t, s, sch, 0, "qos0_fanin"),
    "qos1": lambda t, s, sch: fan_in(t, s, sch, 1, "qos1"),
    "qos1_durable": lambda t, s, sch: fan_in(t, s, sch, 1, "qos1_durable", durable=True),
    "qos1_latency": qos1_latency,
    "fanout": fanout,
    "qos1_latency_flood": lambda t, s, sch: qos1_latency(t, s, sch, flood=True),
}


# -- the report ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Metric:
    """A row of the table. ``higher_is_better`` orients the ratio check; ``ratio_target`` is the issue's
    bound on ours/mosquitto, ``absolute_target`` a bound on our own figure."""

    key: str
    label: str
    fmt: str
    higher_is_better: bool
    ratio_target: float | None = None
    absolute_target: float | None = None


#: The targets are issue 30's (a quiet machine): QoS 0 fan-in >= 2x mosquitto, QoS 1 >= 1.5x, QoS 1 to a
#: durable subscriber >= 1x mosquitto with ``persistence true``, p99 latency no worse. The CPU rows carry
#: the same targets inverted (CPU per message ours/mosquitto <= 1/target), which a loaded machine can check.
METRICS = (
    Metric("qos0_fanin", "QoS 0 fan-in 4->1, msgs/s", "{:,.0f}", True, ratio_target=2.0),
    Metric("qos0_fanin_cpu_us", "QoS 0 fan-in 4->1, broker CPU per message, us", "{:.2f}", False, ratio_target=0.5),
    Metric("qos1", "QoS 1 4->1 window 64, msgs/s", "{:,.0f}", True, ratio_target=1.5),
    Metric("qos1_cpu_us", "QoS 1 4->1 window 64, broker CPU per message, us", "{:.2f}", False, ratio_target=1 / 1.5),
    Metric("qos1_durable", "QoS 1 4->1 window 64 to a durable subscriber (mosquitto: persistence true), msgs/s",
           "{:,.0f}", True, ratio_target=1.0),
    Metric("qos1_durable_cpu_us", "QoS 1 to a durable subscriber, broker CPU per message, us", "{:.2f}", False,
           ratio_target=1.0),
    Metric("latency_p50", "QoS 1 latency p50 at 2,000/s, ms", "{:.2f}", False),
    Metric("latency_p99", "QoS 1 latency p99 at 2,000/s, ms", "{:.2f}", False, ratio_target=1.0),
    Metric("fanout", "fan-out 1->100, deliveries/s", "{:,.0f}", True),
    Metric("fanout_cpu_us", "fan-out 1->100, broker CPU per delivery, us", "{:.2f}", False),
    Metric("latency_flood_p50", "QoS 1 latency p50 at 2,000/s during a QoS 0 flood, ms", "{:.2f}", False),
    Metric("latency_flood_p99", "QoS 1 latency p99 at 2,000/s during a QoS 0 flood, ms", "{:.2f}", False),
    Metric("connect_seconds", "2,000 connections: seconds to connect", "{:.2f}", False),
    Metric("connect_rss_mb", "2,000 connections: broker RSS, MB", "{:.1f}", False, absolute_target=150.0),
)


def _cell(metric: Metric, values: list[float]) -> str:
    if not values:
        return "-"
    text = metric.fmt.format(statistics.median(values))
    if len(values) > 1:
        text += f" ({metric.fmt.format(min(values))}-{metric.fmt.format(max(values))})"
    return text


def _verdict(metric: Metric, ours: float, ratio: float | None) -> str:
    if metric.absolute_target is not None:
        return f"< {metric.absolute_target:g}: {'ok' if ours < metric.absolute_target else 'MISSED'}"
    if metric.ratio_target is None or ratio is None:
        return ""
    sign = ">=" if metric.higher_is_better else "<="
    met = ratio >= metric.ratio_target if metric.higher_is_better else ratio <= metric.ratio_target
    return f"ratio {sign} {metric.ratio_target:.2g}: {'ok' if met else 'MISSED'}"


def table(collected: dict[str, dict[str, list[float]]], sizes: Sizes) -> str:
    """A Markdown table: median per broker (min-max over rounds), ours/mosquitto, the issue's target."""
    lines = [
        "| metric | ours | mosquitto | ratio ours/mosquitto | target |",
        "|---|---|---|---|---|",
    ]
    for metric in METRICS:
        ours = collected["ours"].get(metric.key, [])
        theirs = collected["mosquitto"].get(metric.key, [])
        if not ours and not theirs:
            continue
        ratio = statistics.median(ours) / statistics.median(theirs) if ours and theirs and statistics.median(theirs) else None
        label = metric.label.replace("2,000 connections", f"{sizes.connections:,} connections")
        label = label.replace("1->100", f"1->{sizes.fanout_subscribers}")
        ratio_text = f"{ratio:.2f}" if ratio is not None else "-"
        verdict = _verdict(metric, statistics.median(ours), ratio) if ours else ""
        lines.append(f"| {label} | {_cell(metric, ours)} | {_cell(metric, theirs)} | {ratio_text} | {verdict} |")
    return "\n".join(lines)


# -- running ---------------------------------------------------------------------------------------------


#: The scenarios compared with mosquitto ``persistence true`` (the others with ``persistence false``).
PERSISTENT_SCENARIOS = frozenset({"qos1_durable"})


@contextmanager
def brokers(work_dir: Path, synchronous: str = "normal", persistent: bool = False) -> Iterator[list[Target]]:
    """Start our gateway (``broker.db`` with ``synchronous``) and mosquitto, both on OS-chosen ports, and
    stop them at the end; with ``persistent`` also a mosquitto with ``persistence true`` (third target)."""
    with ExitStack() as stack:
        gateway_config = work_dir / "gateway.toml"
        gateway_config.write_text(f'{GATEWAY_CONFIG}\n[broker.persistence]\nsynchronous = "{synchronous}"\n')
        gateway = stack.enter_context(GatewayProcess(data_dir=work_dir / "gateway", port=0, config=gateway_config))
        mosquitto = stack.enter_context(MosquittoProcess(work_dir / "mosquitto", extra_config=MOSQUITTO_CONFIG))
        assert gateway.process is not None and mosquitto.process is not None
        targets = [
            Target("ours", gateway.host, gateway.port, psutil.Process(gateway.process.pid)),
            Target("mosquitto", mosquitto.host, mosquitto.port, psutil.Process(mosquitto.process.pid)),
        ]
        if persistent:
            store = work_dir / "mosquitto-persistent"
            config = f"{MOSQUITTO_CONFIG}persistence true\npersistence_location {store}/\n"
            keeper = stack.enter_context(MosquittoProcess(store, extra_config=config))
            assert keeper.process is not None
            targets.append(Target("mosquitto", keeper.host, keeper.port, psutil.Process(keeper.process.pid)))
        yield targets


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small counts, 1 s windows, one round (a smoke run)")
    parser.add_argument("--only", default=",".join(SCENARIOS),
                        help=f"comma-separated scenarios to run (default: all of {', '.join(SCENARIOS)})")
    parser.add_argument("--duration", type=float, help="seconds of each measuring window (default 5, quick 1)")
    parser.add_argument("--rounds", type=int, help="rounds per scenario and broker (default 3, quick 1)")
    parser.add_argument("--mqtt", choices=("3.1.1", "5"), default="5", help="protocol level of every client")
    parser.add_argument("--synchronous", choices=("normal", "full"), default="normal",
                        help="our broker.db's synchronous setting (full: an fsync per commit)")
    args = parser.parse_args(argv)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(args.only) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    sizes = replace(sizes, version=MQTT_5 if args.mqtt == "5" else MQTT_311)
    duration = args.duration or (1.0 if args.quick else 5.0)
    schedule = Schedule(warmup=0.3 if args.quick else 1.0, duration=duration)
    rounds = args.rounds or (1 if args.quick else 3)
    raise_fd_limit()  # before the brokers start: they inherit it, and mosquitto needs it for 2,000 clients
    collected: dict[str, dict[str, list[float]]] = {"ours": {}, "mosquitto": {}}
    failed = False
    print(f"bench: {', '.join(args.only)}; MQTT {args.mqtt}; {duration:g} s windows after {schedule.warmup:g} s warm-up, "
          f"{rounds} round(s); broker.db synchronous {args.synchronous}; "
          f"{psutil.cpu_count()} cores, load average {psutil.getloadavg()[0]:.1f}", flush=True)
    persistent = bool(PERSISTENT_SCENARIOS & set(args.only))
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp, \
            brokers(Path(tmp), args.synchronous, persistent) as every_target:
        for name in [scenario for scenario in SCENARIOS if scenario in args.only]:
            # ours, and the mosquitto this scenario is compared with
            targets = [every_target[0], every_target[2 if name in PERSISTENT_SCENARIOS else 1]]
            for round_number in range(rounds):
                order = targets if round_number % 2 == 0 else targets[::-1]
                for target in order:
                    measurement = RUNNERS[name](target, sizes, schedule)
                    for key, value in measurement.values.items():
                        collected[target.name].setdefault(key, []).append(value)
                    figures = ", ".join(f"{key} {value:,.2f}" for key, value in measurement.values.items())
                    print(f"{name} round {round_number + 1} {target.name}: {figures or 'no figures'}; {measurement.note}; "
                          f"load average {psutil.getloadavg()[0]:.1f}", flush=True)
                    for error in measurement.errors:
                        failed = True
                        print(f"  error: {error}", flush=True)
    print()
    print(f"load average at the end {psutil.getloadavg()[0]:.1f}")
    print(table(collected, sizes))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
