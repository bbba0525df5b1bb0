"""Profile our broker under one of the benchmark's loads with py-spy, and print where the time goes.

    .venv/bin/python bench/profile_broker.py qos0_fanin
    .venv/bin/python bench/profile_broker.py qos1 --duration 10 --svg /tmp/qos1.svg

py-spy samples the gateway process from outside, so the broker runs exactly as shipped (uvloop, no
profiler hooks slowing the hot path, which is what cProfile would add). ``--native`` sampling makes the
C frames visible: the garbage collector (``gc_collect_main``) and the ``write``/``read`` system calls
show up next to the Python functions. The summary ranks functions by self time and by inclusive time
from py-spy's raw (collapsed stack) output; ``--svg`` also writes a flame graph.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

if __package__ in (None, ""):  # run by path: make ``bench`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.broker import RUNNERS, Sizes, Target  # noqa: E402
from bench.mqtt_load import Schedule, raise_fd_limit  # noqa: E402
from testing.processes import GatewayProcess  # noqa: E402

#: Samples per second: enough for a stable top 15 in a 10 s window, little enough not to slow the broker.
SAMPLE_RATE = 250


def summarize(collapsed: str, top: int) -> str:
    """Rank functions by self and inclusive share of the samples in py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        names = [frame.split(" (")[0] for frame in stack.split(";")]
        own[names[-1]] += samples
        for name in set(names):
            inclusive[name] += samples
    if not total:
        return "no samples (is py-spy allowed to attach? it needs ptrace permission)"
    lines = [f"{total} samples", "", "self time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines += ["", "inclusive time (appliance code and the collector):"]
    relevant = [(name, n) for name, n in inclusive.most_common() if "." in name or name == "gc_collect_main"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in relevant[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("scenario", choices=sorted(RUNNERS))
    parser.add_argument("--duration", type=float, default=10.0, help="seconds sampled (the measuring window)")
    parser.add_argument("--top", type=int, default=15, help="functions listed per ranking")
    parser.add_argument("--svg", type=Path, help="also write a flame graph here")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        parser.error("py-spy is not installed: .venv/bin/pip install py-spy")
    raise_fd_limit()
    schedule = Schedule(warmup=1.0, duration=args.duration)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp, GatewayProcess(data_dir=Path(tmp), port=0) as gateway:
        assert gateway.process is not None
        pid = str(gateway.process.pid)
        raw = Path(tmp) / "stacks.txt"
        record = [py_spy, "record", "--pid", pid, "--native", "--rate", str(SAMPLE_RATE),
                  "--duration", str(int(schedule.warmup + args.duration))]
        recorders = [subprocess.Popen(record + ["--format", "raw", "-o", str(raw)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)]
        if args.svg is not None:
            recorders.append(subprocess.Popen(record + ["-o", str(args.svg)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        try:
            target = Target("ours", gateway.host, gateway.port, psutil.Process(gateway.process.pid))
            measurement = RUNNERS[args.scenario](target, Sizes.full(), schedule)
        finally:
            for recorder in recorders:
                recorder.wait(timeout=args.duration + 30)
        print(f"{args.scenario}: {measurement.values}; {measurement.note}")
        print(summarize(raw.read_text() if raw.exists() else "", args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
