"""System calls per message of our broker and mosquitto under the same load, side by side.

    .venv/bin/python bench/syscalls.py                          # qos0_fanin, qos1, qos1_durable; 3 s windows
    .venv/bin/python bench/syscalls.py --only qos1 --duration 5

Why: a broker's CPU per message is its own code plus the kernel's work for its reads and writes, and
the second part does not show in ``bench/broker_core.py``'s bytecodes. Each scenario runs twice per
broker (``bench/broker.py``'s loads and brokers, mosquitto with ``persistence true`` for the durable one):

1. unobserved, counting the read and write calls in ``/proc/PID/io`` (``syscr``/``syscw``: every
   ``read``/``readv``/``write``/``writev``, which is how libuv and mosquitto move socket bytes) over the
   measuring window: the figure as shipped;
2. under ``strace -c -f`` attached for the measuring window only: every system call by name. ptrace
   stops the broker at each call, so it runs slower and reads more per call than unobserved (fewer
   calls per message); both brokers are slowed the same way, so compare them within this row. From it
   come ``epoll_wait`` per message (loop turns) and the writes per loop turn (``write``+``writev`` over
   ``epoll_wait``: how well a broker coalesces its output).

Needs strace (``make system-deps``) and ptrace permission on the brokers (root, or a
``kernel.yama.ptrace_scope`` of 0).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import psutil

if __package__ in (None, ""):  # run by path: make ``bench`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.broker import PERSISTENT_SCENARIOS, RUNNERS, Sizes, brokers  # noqa: E402
from bench.mqtt_load import Schedule, raise_fd_limit  # noqa: E402

SCENARIOS = ("qos0_fanin", "qos1", "qos1_durable")
WRITES = ("write", "writev", "sendmsg", "sendto")
READS = ("read", "readv", "recvmsg", "recvfrom")


class IoCounter:
    """``/proc/PID/io``'s read and write calls over the measuring window."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.start = (0, 0)
        self.calls = (0, 0)

    def __call__(self, event: str) -> None:
        if event == "window-start":
            io = self.process.io_counters()
            self.start = (io.read_count, io.write_count)
        elif event == "window-end":
            io = self.process.io_counters()
            self.calls = (io.read_count - self.start[0], io.write_count - self.start[1])


class Strace:
    """``strace -c -f`` on the broker for the measuring window; ``counts`` by system call name."""

    def __init__(self, pid: int, output: Path) -> None:
        self.pid = pid
        self.output = output
        self.tracer: subprocess.Popen[bytes] | None = None
        self.counts: dict[str, int] = {}

    def __call__(self, event: str) -> None:
        if event == "window-start":
            self.tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(self.pid), "-o", str(self.output)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif event == "window-end" and self.tracer is not None:
            self.tracer.send_signal(signal.SIGINT)
            self.tracer.wait(timeout=30)
            self.counts = parse_summary(self.output.read_text() if self.output.exists() else "")


def parse_summary(text: str) -> dict[str, int]:
    """strace -c's table: ``% time seconds usecs/call calls [errors] syscall``, by name."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
            counts[fields[-1]] = int(fields[3])
    return counts


def messages(values: dict[str, float], name: str, duration: float) -> int:
    return int(values.get(name, 0.0) * duration)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", default=",".join(SCENARIOS), help=f"scenarios (default: {', '.join(SCENARIOS)})")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of each measuring window")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    if unknown := sorted(set(only) - set(SCENARIOS)):
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if shutil.which("strace") is None:
        parser.error("strace is not installed (make system-deps)")
    raise_fd_limit()
    schedule = Schedule(warmup=1.0, duration=args.duration)
    sizes = Sizes.full()
    print(f"syscalls: {', '.join(only)}; {args.duration:g} s windows; load average {psutil.getloadavg()[0]:.1f}")
    rows = ["| scenario | broker | reads/msg | writes/msg (unobserved) | strace: syscalls/msg | epoll_wait/msg |"
            " writes per loop turn | top calls per msg |", "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="bench-syscalls-") as tmp, \
            brokers(Path(tmp), persistent=bool(PERSISTENT_SCENARIOS & set(only))) as every_target:
        for name in only:
            for target in [every_target[0], every_target[2 if name in PERSISTENT_SCENARIOS else 1]]:
                io = IoCounter(target.process)
                plain = RUNNERS[name](replace(target, on_event=io), sizes, schedule)
                count = messages(plain.values, name, schedule.duration)
                tracer = Strace(target.process.pid, Path(tmp) / f"strace-{name}-{target.name}.txt")
                traced = RUNNERS[name](replace(target, on_event=tracer), sizes, schedule)
                traced_count = max(1, messages(traced.values, name, schedule.duration))
                calls = tracer.counts
                total = sum(calls.values())
                writes = sum(calls.get(call, 0) for call in WRITES)
                turns = calls.get("epoll_wait", 0) + calls.get("epoll_pwait", 0)
                top = ", ".join(f"{call} {n / traced_count:.3f}" for call, n in
                                sorted(calls.items(), key=lambda item: -item[1])[:5])
                rows.append(
                    f"| {name} | {target.name} | {io.calls[0] / max(1, count):.3f} | {io.calls[1] / max(1, count):.3f} | "
                    f"{total / traced_count:.3f} | {turns / traced_count:.3f} | "
                    f"{writes / turns if turns else 0:.2f} | {top} |")
                print(f"{name} {target.name}: unobserved {count:,} msgs, {io.calls[0]:,} reads, {io.calls[1]:,} writes; "
                      f"traced {traced_count:,} msgs, {total:,} calls ({plain.note}); load average "
                      f"{psutil.getloadavg()[0]:.1f}", flush=True)
    print()
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
