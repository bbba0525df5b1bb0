"""Bench fixtures: the configuration (``--bench FILE``), the run's timelines, the cloud endpoint and the rig.

Scenarios ask for ``rig`` and get a connected `RigClient` whose every command lands in the scenario's
timeline; on the local bench the rig process is spawned for the test and removed after it, on a real bench
the configured serial device is opened and the link is RESET before and after the test. The timelines of
a run are summarized in a table at the end of the pytest output.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hil_tests.bench import DEFAULT_BENCH, BenchConfig, load_bench
from hil_tests.rig.client import RigClient
from hil_tests.rig.launcher import local_rig
from hil_tests.timeline import Timeline, TimelineRun, format_summary, summarize
from tests.support.processes import MosquittoProcess

RUN_KEY = pytest.StashKey[TimelineRun]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench",
        default=str(DEFAULT_BENCH),
        metavar="CONFIG",
        help="HIL bench configuration (TOML); default: the local simulated bench hil_tests/bench.toml",
    )


@pytest.fixture(scope="session")
def bench(request: pytest.FixtureRequest) -> BenchConfig:
    return load_bench(Path(request.config.getoption("--bench")))


@pytest.fixture(scope="session")
def hil_run(request: pytest.FixtureRequest, bench: BenchConfig) -> TimelineRun:
    run = TimelineRun(bench.artifacts_dir)
    request.config.stash[RUN_KEY] = run
    return run


@pytest.fixture
def timeline(request: pytest.FixtureRequest, hil_run: TimelineRun) -> Iterator[Timeline]:
    with hil_run.timeline(request.node.name) as scenario_timeline:
        yield scenario_timeline


@pytest.fixture
def cloud_endpoint(bench: BenchConfig, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The cloud-side broker: a local mosquitto when the bench says ``start = true``, else the configured one."""
    if not bench.cloud.start:
        yield bench.cloud.host, bench.cloud.port
        return
    with MosquittoProcess(tmp_path / "cloud", port=bench.cloud.port or None) as broker:
        yield broker.host, broker.port


@pytest.fixture
def rig(request: pytest.FixtureRequest, bench: BenchConfig, timeline: Timeline, tmp_path: Path) -> Iterator[RigClient]:
    """A connected rig client; ``rig.status()`` tells where the gateway's uplink goes (``listen`` or namespaces)."""
    if not bench.rig.local:
        with RigClient(bench.rig.serial, baudrate=bench.rig.baud, on_command=timeline.rig) as client:
            client.reset()
            yield client
            client.reset()
        return
    args = ["--backend", bench.rig.backend]
    if bench.rig.backend == "userspace":
        host, port = request.getfixturevalue("cloud_endpoint")
        args += ["--target", f"{host}:{port}"]
    with local_rig(args, tmp_path / "rig.log") as ready:
        with RigClient(ready["serial"], baudrate=bench.rig.baud, on_command=timeline.rig) as client:
            yield client


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is None:
        return
    records = run.records()
    if records:
        terminalreporter.write_sep("=", f"HIL timelines: {run.folder}")
        terminalreporter.write_line(format_summary(summarize(records)))
