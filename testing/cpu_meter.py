"""A pytest plugin that charges each test phase the CPU time it costs, child processes included.

    CPU_METER_DIR=/tmp/meter pytest -p testing.cpu_meter -n 4 --dist loadgroup ...   (root, cgroup v1)

Why a cgroup: a test's cost is mostly in processes it starts (gateways, mosquitto, MicroPython, Spark's
JVMs and the orphans they leave), which the worker's own ``getrusage`` does not see until it waits for
them, and never sees for processes another process reaps. Each pytest process (an xdist worker, or the
one process of ``-n 0``) moves itself into a ``cpuacct`` cgroup of its own,
``/sys/fs/cgroup/cpuacct/<CPU_METER_CGROUP>/<worker>``; everything it starts is born there, so the
group's usage before and after a phase is that phase's cost, and nothing another worker does is in it.
(A process a test leaves running is charged to the phases that follow on that worker.)

Writes one JSON line per phase (``nodeid``, ``phase``, ``cpu`` and ``wall`` seconds) to
``<CPU_METER_DIR>/<worker>.jsonl``, and the process' start-up (before the move), collection and whole
session. ``python -m testing.cpu_meter <CPU_METER_DIR>`` sums them per module, most CPU first
(bench/RESULTS-suite.md).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class Meter:
    def __init__(self, folder: Path, worker: str) -> None:
        group = CPUACCT / os.environ.get("CPU_METER_CGROUP", "cpu-meter") / worker
        group.mkdir(parents=True, exist_ok=True)
        self.before_move = sum(os.times()[:2])  # interpreter start-up and plugin imports
        (group / "cgroup.procs").write_text(str(os.getpid()))
        self.usage_file = group / "cpuacct.usage"
        folder.mkdir(parents=True, exist_ok=True)
        self.out = (folder / f"{worker}.jsonl").open("a")
        self.worker = worker
        self.started = self.usage()

    def usage(self) -> float:
        """CPU seconds of everything this process and its descendants have run in the group."""
        return int(self.usage_file.read_text()) / 1e9

    def record(self, **fields: Any) -> None:
        self.out.write(json.dumps({"worker": self.worker, **fields}) + "\n")
        self.out.flush()


_meter: Meter | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _meter
    folder = os.environ.get("CPU_METER_DIR")
    if folder:
        worker = getattr(config, "workerinput", {}).get("workerid", "main")
        _meter = Meter(Path(folder), worker)
        _meter.record(phase="startup", cpu=_meter.before_move)


def pytest_collection_finish(session: pytest.Session) -> None:
    if _meter is not None:
        _meter.record(phase="collection", cpu=_meter.usage() - _meter.started)


def _phase(item: pytest.Item, phase: str) -> Iterator[None]:
    if _meter is None:
        yield
        return
    cpu, wall = _meter.usage(), time.monotonic()
    yield
    _meter.record(nodeid=item.nodeid, phase=phase, cpu=_meter.usage() - cpu, wall=time.monotonic() - wall)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _phase(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _phase(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _phase(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Iterator[None]:
    cpu = _meter.usage() if _meter is not None else 0.0
    yield
    if _meter is not None:
        _meter.record(phase="sessionfinish", cpu=_meter.usage() - cpu, total=_meter.usage())


def per_module(folder: Path) -> dict[str, tuple[float, float, int]]:
    """Module -> (CPU seconds, wall seconds, tests) of the phases recorded in ``folder``."""
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "nodeid" in record:
                test = record["nodeid"].split("@")[0]  # without pytest-xdist's group suffix
                module = test.split("::")[0]
                cpu[module] += record["cpu"]
                wall[module] += record["wall"]
                tests[module].add(test)
    return {module: (cpu[module], wall[module], len(tests[module])) for module in sorted(cpu, key=cpu.__getitem__, reverse=True)}


def main(argv: list[str]) -> int:
    modules = per_module(Path(argv[0]))
    print(f"{'module':64} {'CPU-s':>7} {'wall-s':>7} {'tests':>5}")
    for module, (cpu, wall, tests) in modules.items():
        print(f"{module:64} {cpu:7.1f} {wall:7.1f} {tests:5d}")
    print(f"{'all tests':64} {sum(m[0] for m in modules.values()):7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
