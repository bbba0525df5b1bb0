"""The scenarios against a bench described only by its bench file: a bridge rig box between a gateway and its uplink.

A real bench is cabled by hand, and the suite learns it from ``--bench bench.toml`` alone: the rig's serial
device, where the gateway runs and listens, and the cloud broker's address. Here the cabling is the three
namespaces of `hil_tests/bridge_site.py`; a rig process already runs in the rig namespace (``--backend
bridge --ports eth1,eth2``, on a pty whose device name goes into the file, as ``/dev/ttyUSB0`` would),
mosquitto already runs in the uplink namespace (``cloud.start = false``), and the gateway is started by the
scenarios behind ``gateway.run_in = ["ip", "netns", "exec", <gateway namespace>]``. A second pytest runs the
scenarios on that file, so nothing in it knows the bench is simulated. Afterwards nothing of it is left.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil_tests.bench import DEFAULT_BENCH, BenchConfig, load_bench
from hil_tests.bridge_site import bridge_bench as bench_in_namespaces
from hil_tests.bridge_site import leftovers
from hil_tests.netns_site import netns_refusal
from hil_tests.rig.launcher import REPO_ROOT
from hil_tests.timeline import TimelineRun

SCENARIOS = REPO_ROOT / "hil_tests" / "scenarios"
RUN_TIMEOUT_S = 300


@pytest.fixture(params=["relay", "plain"])
def bridge_bench(request: pytest.FixtureRequest, bench: BenchConfig, hil_run: TimelineRun, tmp_path: Path) -> Iterator[Path]:
    """Cable the namespaces, start the rig and the cloud broker, and write the bench file that describes them.

    ``plain``: the rig only bridges (rate, loss, down), the gateway's uplink goes to the broker across it
    untouched, as on a bench without DELAY. ``relay``: the rig also has ``--address`` and ``--target``, so
    DELAY/JITTER work and the gateway's uplink goes to the rig's relay (STATUS ``relay``)."""
    if bench.source != DEFAULT_BENCH:
        pytest.skip("runs only with the default bench: --bench already names the bench under test")
    refusal = netns_refusal()
    if refusal is not None:
        pytest.skip(refusal)
    with bench_in_namespaces(tmp_path, hil_run.folder / "bridge", relay=request.param == "relay") as (config, site):
        loaded = load_bench(config)
        assert not loaded.rig.local and not loaded.cloud.start and loaded.gateway.run_in == tuple(site.exec_in(site.gateway_ns))
        yield config
    assert not leftovers(site.namespaces), "a namespace of the bridge bench was left behind"


def _run_scenarios(config: Path, *targets: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *targets, "--bench", str(config)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "skipped" not in result.stdout, result.stdout[-3000:]
    return result.stdout


def test_set_point_propagation_runs_on_a_bench_described_only_by_its_file(bridge_bench: Path) -> None:
    out = _run_scenarios(bridge_bench, str(SCENARIOS / "test_set_point_propagation.py"))
    assert "1 passed" in out


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)  # the nested run's own limit, not the suite's 120 s per test
@pytest.mark.parametrize("bridge_bench", ["relay"], indirect=True)  # scenario 3 needs DELAY
def test_every_scenario_runs_on_the_bridge_bench(bridge_bench: Path) -> None:
    out = _run_scenarios(bridge_bench, str(SCENARIOS), "-k", "not satellite")  # its outages take minutes
    assert " passed" in out and "failed" not in out


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("bridge_bench", ["relay"], indirect=True)
def test_the_satellite_scenario_runs_on_the_bridge_bench(bridge_bench: Path) -> None:
    """Scenario 7 needs every feature: rate, loss and DOWN in the kernel, the 600 ms delay in the rig's relay."""
    out = _run_scenarios(bridge_bench, str(SCENARIOS / "test_satellite_link.py"), "-k", "outage30s", "-s")
    assert "1 passed" in out
