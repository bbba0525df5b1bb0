"""The ``system`` fixture: gateway (uplink through the rig), cloud collector, gateway tap and thermostats.

A scenario calls ``system(routes, thermostats=N, telemetry_ms=...)`` once and gets everything running and
connected: the gateway runs where the bench's ``site`` says (on the host, or in the netns rig's gateway
namespace), its store-and-forward bridge points across the rig, the collector listens on the
cloud broker behind it, and every thermostat has registered its set point key. Everything it started is
stopped when the test ends, also when it fails.

The bridge sends in the ``upstream_format`` fixture's format: a scenario marked ``forwarding`` runs once per
format of the bench's ``gateway.upstream_formats`` (test ids ``[message]``, ``[batch]``), any other in the
first of them.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hil_tests.bench import BenchConfig
from hil_tests.harness import (
    CloudCollector,
    GatewayTap,
    Recorder,
    Route,
    Site,
    System,
    Thermostat,
    thermostat_config,
    write_gateway_config,
)
from hil_tests.rig.client import RigClient
from hil_tests.timeline import Timeline
from testing.processes import GatewayProcess


@pytest.fixture
def upstream_format(request: pytest.FixtureRequest, bench: BenchConfig) -> str:
    """``[forwarding.upstream] format`` of the scenario's gateway (``forwarding`` scenarios are parametrized
    by it in hil_tests/conftest.py)."""
    return getattr(request, "param", bench.gateway.upstream_formats[0])


@pytest.fixture
def recorder(timeline: Timeline, rig: RigClient) -> Recorder:
    """The timeline behind a lock; the rig's commands go through it too, as they race the taps' records."""
    locked = Recorder(timeline)
    rig.on_command = locked.rig
    return locked


@pytest.fixture
def system(
    request: pytest.FixtureRequest, bench: BenchConfig, recorder: Recorder, upstream_format: str, tmp_path: Path
) -> Iterator[Callable[..., System]]:
    """Start the system of a scenario; the logs of gateway, rig and cloud broker are kept with its timeline."""
    if not (bench.gateway.start and bench.devices.start):
        pytest.skip("the scenarios start the gateway and the thermostats themselves (gateway.start, devices.start)")
    site: Site = request.getfixturevalue("site")
    cloud_endpoint: tuple[str, int] = request.getfixturevalue("cloud_endpoint")
    with contextlib.ExitStack() as stack:

        def start(routes: tuple[Route, ...], thermostats: int, telemetry_ms: int, keepalive_s: int = 1) -> System:
            config = write_gateway_config(tmp_path / "gateway", site.upstream, routes, keepalive_s, upstream_format)
            gateway = site.gateway(tmp_path / "gateway" / "data", config)
            fleet: list[Thermostat] = []
            stack.callback(keep_logs, gateway, fleet, tmp_path, recorder.timeline.path)
            stack.callback(gateway.kill9)
            gateway.start()
            cloud = CloudCollector(cloud_endpoint[0], cloud_endpoint[1], recorder)
            stack.callback(cloud.close)
            tap = GatewayTap(gateway.host, gateway.port, recorder, routes)
            stack.callback(tap.close)
            for number in range(thermostats):
                name = f"{bench.devices.id_prefix}{number:02d}"
                thermostat = Thermostat(
                    name, tmp_path / name, bench.devices.micropython, bench.devices.firmware.parent,
                    thermostat_config(name, gateway.host, gateway.port, telemetry_ms=telemetry_ms),
                )
                stack.callback(thermostat.kill9)
                fleet.append(thermostat.start())
            for thermostat in fleet:
                thermostat.expect(rf"^registered {thermostat.name}\\setPoint$", timeout=30)
            return System(gateway, cloud, tap, fleet, recorder, routes)

        yield start


def keep_logs(gateway: GatewayProcess, fleet: list[Thermostat], tmp_path: Path, timeline_path: Path) -> None:
    """Copy the run's logs next to the timeline (``<scenario>.gateway.log`` ...): pytest's tmp folders
    are rotated away by later runs, and a failed scenario is explained by these."""
    timeline_path.with_suffix(".gateway.log").write_text(gateway.output())
    timeline_path.with_suffix(".thermostats.log").write_text(
        "".join(f"{t.name} {when:.3f} {line}\n" for t in fleet for line, when in zip(t.lines, t.times, strict=False))
    )
    for name, source in (("rig", tmp_path / "rig.log"), ("cloud", next((tmp_path / "cloud").glob("*.log"), None))):
        if source is not None and source.exists():
            shutil.copyfile(source, timeline_path.with_suffix(f".{name}.log"))
