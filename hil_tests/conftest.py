"""Bench fixtures: the configuration (``--bench FILE``), the run's timelines, the cloud endpoint and the rig.

Scenarios ask for ``rig`` and get a connected `RigClient` whose every command lands in the scenario's
timeline; on the local bench the rig process is spawned for the test and removed after it, on a real bench
the configured serial device is opened and the link is RESET before and after the test. ``site`` says where
the scenario's gateway runs and where its uplink connects: on a local netns bench the gateway and the
cloud broker run inside the rig's namespaces (`hil_tests/netns_site.py`). The timelines of a run are
summarized in a table at the end of the pytest output.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hil_tests.bench import DEFAULT_BENCH, BenchConfig, load_bench
from hil_tests.bridge_site import apply_image_sysctls
from hil_tests.harness import Site
from hil_tests.history import RunInfo
from hil_tests.netns_site import (
    CLOUD_BROKER_PORT,
    HostLinks,
    NamespacedGateway,
    NamespacedMosquitto,
    PrefixedGateway,
    netns_refusal,
)
from hil_tests.report import write_run_report
from hil_tests.rig.client import RigClient
from hil_tests.rig.launcher import local_rig
from hil_tests.timeline import Timeline, TimelineRun, format_summary, summarize
from testing.processes import GatewayProcess, MosquittoProcess

RUN_KEY = pytest.StashKey[TimelineRun]()
OUTCOMES_KEY = pytest.StashKey["RunOutcomes"]()
BENCH_KEY = pytest.StashKey[BenchConfig]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench",
        default=str(DEFAULT_BENCH),
        metavar="CONFIG",
        help="HIL bench configuration (TOML); default: the local simulated bench hil_tests/bench.toml",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[OUTCOMES_KEY] = RunOutcomes()
    config.pluginmanager.register(config.stash[OUTCOMES_KEY], "hil-run-outcomes")
    config.addinivalue_line(
        "markers", "forwarding: a store-and-forward scenario; runs once per gateway.upstream_formats of the bench"
    )


def bench_of(config: pytest.Config) -> BenchConfig:
    """The ``--bench`` configuration, loaded once per session (collection parametrizes by it, too)."""
    if BENCH_KEY not in config.stash:
        config.stash[BENCH_KEY] = load_bench(Path(config.getoption("--bench")))
    return config.stash[BENCH_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A scenario marked ``forwarding`` runs once per upstream format of the bench (``upstream_format``)."""
    if "upstream_format" in metafunc.fixturenames and metafunc.definition.get_closest_marker("forwarding"):
        formats = bench_of(metafunc.config).gateway.upstream_formats
        metafunc.parametrize("upstream_format", formats, ids=formats)


@pytest.fixture(scope="session")
def bench(request: pytest.FixtureRequest) -> BenchConfig:
    return bench_of(request.config)


@pytest.fixture(scope="session")
def hil_run(request: pytest.FixtureRequest, bench: BenchConfig) -> TimelineRun:
    run = TimelineRun(bench.artifacts_dir)
    request.config.stash[RUN_KEY] = run
    return run


@pytest.fixture
def timeline(request: pytest.FixtureRequest, hil_run: TimelineRun) -> Iterator[Timeline]:
    with hil_run.timeline(request.node.name) as scenario_timeline:
        yield scenario_timeline


def _local_netns(bench: BenchConfig) -> bool:
    return bench.rig.local and bench.rig.backend == "netns"


@pytest.fixture
def cloud_endpoint(request: pytest.FixtureRequest, bench: BenchConfig, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The cloud-side broker as the host reaches it: a local mosquitto when the bench says ``start = true``
    (on a local netns bench inside the rig's cloud namespace), else the configured one."""
    if not bench.cloud.start:
        yield bench.cloud.host, bench.cloud.port
        return
    if _local_netns(bench):
        links: HostLinks = request.getfixturevalue("host_links")
        with NamespacedMosquitto(tmp_path / "cloud", links.cloud) as broker:
            yield broker.host, broker.port
        return
    with MosquittoProcess(tmp_path / "cloud", port=bench.cloud.port or None) as broker:
        yield broker.host, broker.port


@pytest.fixture
def host_links(rig: RigClient) -> Iterator[HostLinks]:
    """The host's unshaped links into the local netns rig's namespaces (`hil_tests/netns_site.py`)."""
    status = rig.status()
    with HostLinks(status["gateway_ns"], status["cloud_ns"]) as links:
        yield links


@pytest.fixture
def site(request: pytest.FixtureRequest, bench: BenchConfig, rig: RigClient) -> Site:
    """Where the scenario's gateway runs and where its uplink connects.

    Local userspace rig: a host gateway whose uplink goes to the relay's ``listen``. Local netns rig: the
    gateway in the gateway namespace, its uplink to the rig's delay ``relay`` in the cloud namespace, across
    the shaped veth. A rig on its serial device (a bridge rig box): the gateway runs behind
    ``gateway.run_in`` on ``gateway.host:port``, its uplink to the rig's ``relay`` when the rig has one
    (DELAY/JITTER), else to the cloud broker's uplink address; the cabling takes it through the rig."""
    status = rig.status()
    if bench.rig.local and "listen" in status:
        host, port = status["listen"].rsplit(":", 1)
        return Site((host, int(port)), lambda data_dir, config: GatewayProcess(data_dir, config=config))
    if _local_netns(bench):
        links: HostLinks = request.getfixturevalue("host_links")
        host, port = status["relay"].rsplit(":", 1)
        namespace, address = links.gateway.namespace, links.gateway.address
        # The gateway's network stack as the gateway image sets the box's (its retransmission floor for a
        # slow uplink), as on the bridge bench: without it an alert took 4.52 s against 3 s on this bench.
        apply_image_sysctls(namespace)
        return Site((host, int(port)), lambda data_dir, config: NamespacedGateway(namespace, address, data_dir, config))
    upstream = bench.cloud.uplink
    if "relay" in status:
        relay_host, relay_port = status["relay"].rsplit(":", 1)
        upstream = (relay_host, int(relay_port))
    gateway = bench.gateway
    return Site(
        upstream,
        lambda data_dir, config: PrefixedGateway(gateway.run_in, gateway.host, data_dir, config, gateway.port),
    )


@pytest.fixture
def rig(request: pytest.FixtureRequest, bench: BenchConfig, timeline: Timeline, tmp_path: Path) -> Iterator[RigClient]:
    """A connected rig client; ``rig.status()`` tells where the gateway's uplink goes (``listen`` or namespaces)."""
    if not bench.rig.local:
        with RigClient(bench.rig.serial, baudrate=bench.rig.baud, on_command=timeline.rig) as client:
            client.reset()
            restarted_before = client.status().get("restarted", "0")
            yield client
            restarted_after = client.status().get("restarted", "0")
            client.reset()
            if restarted_after != restarted_before:
                pytest.fail("the rig box's rig restarted during the scenario (STATUS restarted=1: it was killed or "
                            "crashed, and its successor set the link back to unshaped and up); see journalctl -u hil-rig")
        return
    args = ["--backend", bench.rig.backend]
    if bench.rig.backend == "userspace":
        host, port = request.getfixturevalue("cloud_endpoint")
        args += ["--target", f"{host}:{port}"]
    else:
        refusal = netns_refusal()
        if refusal is not None:
            pytest.skip(refusal)
        # The cloud broker starts in the cloud namespace after the rig has made it; its port is fixed there.
        args += ["--target", f"127.0.0.1:{CLOUD_BROKER_PORT}"]
    with (
        local_rig(args, tmp_path / "rig.log") as ready,
        RigClient(ready["serial"], baudrate=bench.rig.baud, on_command=timeline.rig) as client,
    ):
        yield client


def run_info(run_id: str, bench: BenchConfig) -> RunInfo:
    """The run as the bench's history records it: when, which bench and rig, which gateway and firmware."""
    import appliance

    commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    firmware = bench.devices.firmware.parent / "thermostat.py"
    found = re.search(r'^VERSION = "([^"]+)"', firmware.read_text(), re.M) if firmware.exists() else None
    return RunInfo(
        run_id=run_id,
        started=_started(run_id),
        bench=bench.history.bench,
        rig=f"{bench.rig.backend} on {bench.rig.serial}" if bench.rig.local else bench.rig.serial,
        gateway_version=appliance.__version__ + (f"+{commit}" if commit else ""),
        firmware_version=found.group(1) if found else "unknown",
    )


def _started(run_id: str) -> str:
    """When the run started: its id begins with the UTC time (`timeline.new_run_id`), else now."""
    try:
        return datetime.strptime(run_id[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).isoformat()
    except ValueError:
        return datetime.now(UTC).isoformat(timespec="seconds")


class RunOutcomes:
    """A plugin that keeps each test's outcome by its name (the timeline's scenario) for summary.md."""

    def __init__(self) -> None:
        self.by_name: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.failed:
            name = report.nodeid.rsplit("::", 1)[-1]
            if self.by_name.get(name) != "failed":
                self.by_name[name] = report.outcome


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is None:
        return
    records = run.records()
    if records:
        terminalreporter.write_sep("=", f"HIL timelines: {run.folder}")
        terminalreporter.write_line(format_summary(summarize(records)))
        try:
            bench = bench_of(config)
            summary = write_run_report(run.folder, config.stash[OUTCOMES_KEY].by_name, bench.history.database,
                                       run_info(run.run_id, bench), bench.history.trend_runs)
        except Exception as error:  # a broken plot must not hide the run's own result; say what broke
            terminalreporter.write_line(f"HIL report not written: {type(error).__name__}: {error}", red=True)
        else:
            terminalreporter.write_line(f"HIL report: {summary} (plots beside each timeline)")
