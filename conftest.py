"""The test suite's layers, marked by path, and the rule that keeps the fast layer honest.

Every test item gets exactly one layer marker:

* ``unit``: no sockets, no processes; pure logic, SQLite files, pty pairs, gpiozero's MockFactory, the
  broker core on a fake clock. ``make check`` runs this layer alone, in seconds.
* ``inprocess``: real sockets on loopback, the broker or a service running in the test process.
* ``process``: real child processes: ``appliance run``, mosquitto, micropython, Spark's JVM.
* ``hil``: the hardware-in-the-loop rig and scenarios (``hil_tests/``); their bounds are wall-clock
  latencies of one thing at a time on a bench, so ``make test`` runs them one at a time per bench: the rig's
  own tests on one worker of its parallel run, the scenarios on another (`worker_group`, `HIL_GROUPS`).

The layer is decided by the test module's path, from the tables below; a module that is in none of them is
taken to be ``process``, the safe side (it is never run by ``make check``). A ``unit`` module is held to
its promise at run time: binding or connecting a socket or starting a process fails the test, so a unit
test that grows a network dependency is moved, not silently slowed down. (An event loop's self-pipe is a
``socketpair``, which neither binds nor connects, so asyncio code stays unit.)

Beside the layers, the suite is cut into the Makefile's targets by markers (``slow``, ``image``,
``cluster``, ``spark``: pyproject.toml), each of which CI runs as a step of its own (``.ci/run``) or not at
all (``slow``); ``make test`` is what is left.
Every test that takes the ``spark`` fixture, directly or through another fixture, is marked ``spark`` here
at collection, so a new Spark test lands in ``make test-spark`` by itself. Spark tests share one JVM per
pytest process (``tests/pipeline/conftest.py``), so under pytest-xdist each worker that runs one starts its
own (1 GB of driver memory each); the ``spark`` worker group keeps them on one worker of a parallel run
(``make test-slow``). tests/test_make_targets.py holds every collected test to exactly one target.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import NamedTuple

import pytest

# ``make check`` is the inner loop: the same properties on fewer examples (``--hypothesis-profile=check``,
# registered by the import); ``make test`` keeps hypothesis' default profile and every campaign's own count.
import testing.campaigns  # noqa: F401

LAYERS = ("unit", "inprocess", "process", "hil")

UNIT_MODULES = frozenset(
    {
        "tests/broker/test_certificates.py",
        "tests/broker/test_codec.py",
        "tests/broker/test_footprint.py",
        "tests/broker/test_hardening.py",
        "tests/broker/test_imports.py",
        "tests/broker/test_keepalive.py",
        "tests/broker/test_limits.py",
        "tests/broker/test_login_gate.py",
        "tests/broker/test_request_envelope.py",
        "tests/broker/test_offline_queue.py",
        "tests/broker/test_pair_fuzz.py",
        "tests/broker/test_retain.py",
        "tests/broker/test_retained_feed.py",
        "tests/broker/test_session.py",
        "tests/broker/test_store_failure.py",
        "tests/broker/test_timing.py",
        "tests/broker/test_topic_tree.py",
        "tests/broker/test_websocket.py",
        "tests/config/test_hostile_tables.py",
        "tests/config/test_load.py",
        "tests/config/test_reference.py",
        "tests/config/test_schema.py",
        "tests/conformance/test_host_codecs.py",
        "tests/firmware/test_firmware_gateway.py",
        "tests/forwarding/test_batch.py",
        "tests/forwarding/test_conditions.py",
        "tests/forwarding/test_config.py",
        "tests/forwarding/test_flow_limit.py",
        "tests/forwarding/test_in_flight.py",
        "tests/forwarding/test_liveness.py",
        "tests/forwarding/test_manifest.py",
        "tests/forwarding/test_pump.py",
        "tests/forwarding/test_queues.py",
        "tests/forwarding/test_routes.py",
        "tests/forwarding/test_service.py",
        "tests/forwarding/test_upstream_layers.py",
        "tests/forwarding/test_window.py",
        "tests/hardware/test_at.py",
        "tests/test_atomic_file.py",
        "tests/test_backoff.py",
        "tests/test_campaigns.py",
        "tests/test_layers.py",
        "tests/test_prometheus.py",
        "tests/test_runtime_port.py",
        "tests/testing/test_fake_runtime.py",
        "tests/testing/test_run_queue.py",
        "tests/test_tool_connection.py",
        "tests/test_worker_groups.py",
        "tests/hardware/test_config.py",
        "tests/hardware/test_factory_reset.py",
        "tests/hardware/test_gpio.py",
        "tests/hardware/test_link_source.py",
        "tests/hardware/test_modem.py",
        "tests/hardware/test_modem_status.py",
        "tests/hardware/test_service.py",
        "tests/pipeline/test_envelope_batches.py",
        "tests/pipeline/test_landing.py",
        "tests/pipeline/test_package.py",
        "tests/pipeline/test_setpoints.py",
        "tests/pipeline/test_shipping.py",
        "tests/statestore/test_commands.py",
        "tests/statestore/test_config.py",
        "tests/statestore/test_hlc.py",
        "tests/statestore/test_lease.py",
        "tests/statestore/test_notify.py",
        "tests/statestore/test_resp3.py",
        "tests/statestore/test_service.py",
        "tests/statestore/test_store.py",
        "tests/statestore/test_store_model.py",
    }
)

INPROCESS_MODULES = frozenset(
    {
        "tests/bench/test_broker_light.py",
        "tests/broker/test_retained_feed_sockets.py",
        "tests/broker/test_server.py",
        "tests/broker/test_server_linger.py",
        "tests/broker/test_server_login.py",
        "tests/broker/test_services.py",
        "tests/statestore/test_hosted.py",
        "tests/testing/test_collector.py",
        "tests/testing/test_paho_clients.py",
    }
)


#: Modules of ``hil_tests/`` that check the bench's logic alone (the rig's protocol and shaping arithmetic,
#: its claim file and journal, the client's parsing, the timeline, report and history): no rig, no
#: namespace, no latency bound. They stay in the hil layer but not on a hil worker, the run's tail (94
#: tests that the serial hil worker ran one after the other beside the scenarios).
HIL_LOGIC_MODULES = frozenset(
    {
        "hil_tests/rig/tests/test_claim_and_journal.py",
        "hil_tests/rig/tests/test_client.py",
        "hil_tests/rig/tests/test_protocol.py",
        "hil_tests/rig/tests/test_shaping.py",
        "hil_tests/tests/test_collector.py",
        "hil_tests/tests/test_history.py",
        "hil_tests/tests/test_report.py",
        "hil_tests/tests/test_timeline.py",
    }
)


#: The hil layer's worker groups, by folder (the first prefix that matches): each runs one test at a time on
#: one worker, and the groups run side by side. They share no bench. The rig's own tests (``hil_tests/rig/``)
#: each build the bench they test (namespaces and veth pairs named per run, a local rig on its own pty, the
#: relay's peers on free ports or inside those fresh namespaces) and never take the bench file's fixtures
#: (``rig``, ``site``, ``system``: tests/test_worker_groups.py checks it); the scenarios and the bench's own
#: tests (``hil_tests/scenarios/``, ``hil_tests/tests/``) run on the bench the ``--bench`` file names, which
#: on a lab bench is one rig box and one gateway: one scenario at a time there. The rig's group is the
#: longer (its tests about 100 s quiet, the scenarios group's 75), so it goes out first.
HIL_GROUPS = (("hil_tests/rig/", "hil-rig"), ("hil_tests/", "hil-scenarios"))


def layer_of(module_path: str) -> str:
    """The layer of a test module, by its path relative to the repository root."""
    if module_path.startswith("hil_tests/"):
        return "hil"
    if module_path in UNIT_MODULES:
        return "unit"
    if module_path in INPROCESS_MODULES:
        return "inprocess"
    return "process"


def pytest_configure(config: pytest.Config) -> None:
    descriptions = {
        "unit": "no sockets, no processes (make check)",
        "inprocess": "real sockets, the broker or a service in the test process",
        "process": "real child processes: appliance run, mosquitto, micropython, Spark",
        "hil": "the hardware-in-the-loop rig and scenarios",
    }
    for layer in LAYERS:
        config.addinivalue_line("markers", f"{layer}: {descriptions[layer]}")
    # pytest-xdist would send the groups out by their number of tests (220 tiny codec vectors before the
    # hil groups, the run's longest); `send_order` decides instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def worker_group(layer: str, fixtures: list[str], module: str, module_fixtures: list[str]) -> str | None:
    """The pytest-xdist worker that must run a test, if it may not go to any.

    ``make test`` runs the whole suite in one parallel run (``--dist loadgroup``). The suite is bound by
    waiting (links shaped to 9.6 kbit/s, processes starting, keep-alives), not by the two cores, so the hil
    layer runs beside the others - but in order within each of `HIL_GROUPS`, one worker each, because
    their bounds are latencies of one scenario at a time on a bench and the scenarios share the bench of
    the ``--bench`` file; the rig's own tests build their own benches, so they run beside the scenarios
    (`HIL_LOGIC_MODULES`, which use no bench, go to any worker). The Spark tests are not in ``make test``
    (their own target, ``make test-spark``); where a parallel run has them (``make test-slow``), every test
    that takes the ``spark`` fixture runs on one worker, so the run starts one JVM for them instead of one
    per worker.

    A test that takes a module-scoped fixture (``module_fixtures``: a gateway, mosquitto, a built image
    tree or firmware bundle shared by the module's tests) runs on the worker of its module: a module
    scope is per worker, so spread over four workers the module would start it four times (the image
    tree's build, 20-40 s, ran three times in one run; the OTA bundles three times).
    """
    if layer == "hil" and module not in HIL_LOGIC_MODULES:
        return next(group for folder, group in HIL_GROUPS if module.startswith(folder))
    if "spark" in fixtures:
        return "spark"
    if module_fixtures:
        return module
    return None


def module_scoped(item: pytest.Item) -> list[str]:
    """The fixtures of ``item`` that live as long as its module (or a class in it)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [name for name, defs in info.name2fixturedefs.items() if defs and defs[-1].scope in ("module", "class")]


LAYERS_SLOWEST_FIRST = ("hil", "process", "inprocess", "unit")
#: The named groups in `send_order`'s order; the groups of modules come after them, the single tests last.
#: ``make test`` has no Spark test: its longest groups are the hil ones (90-190 s of a worker's wall time,
#: mostly waiting on their links), which start first so the other workers' CPU-bound tests run beside them.
#: ``spark`` is for a parallel run that has the Spark tests (``make test-slow``).
GROUPS_LONGEST_FIRST = (*(group for _, group in HIL_GROUPS), "spark")


def send_order(group: str | None, layer: str) -> tuple[int, int]:
    """The order the work goes out in: the longest groups first (the hil groups, then spark where a run has
    it, then the modules that share a fixture), then the single tests, slowest layer first, so the unit
    tests fill the end of the run and no worker starts a long test when the others are nearly done."""
    if group in GROUPS_LONGEST_FIRST:
        group_rank = GROUPS_LONGEST_FIRST.index(group)
    else:
        group_rank = len(GROUPS_LONGEST_FIRST) + (group is None)
    return group_rank, LAYERS_SLOWEST_FIRST.index(layer)


class CollectedTest(NamedTuple):
    """A test as the whole suite's collection found it, before ``-m`` or ``-k`` selected anything."""

    nodeid: str
    module: str
    markers: frozenset[str]
    takes_spark: bool


#: Every test of a run that collected all of pyproject's ``testpaths`` (`collects_every_test_path`), so the
#: check that each runs in exactly one Makefile target (tests/test_make_targets.py) costs ``make test``
#: nothing: its workers collect the whole suite anyway.
COLLECTED = pytest.StashKey[list[CollectedTest]]()


def collects_every_test_path(config: pytest.Config) -> bool:
    """Whether this run collects the whole suite: all of the ``testpaths`` and nothing left out of them by
    ``--ignore`` or ``--last-failed`` (``-m``, ``-k`` and ``--deselect`` only select after collection)."""
    root = config.rootpath
    whole = {(root / path).resolve() for path in config.getini("testpaths")}
    asked = {(root / argument.split("::")[0]).resolve() for argument in config.args}
    left_out = config.getoption("ignore") or config.getoption("ignore_glob") or config.getoption("lf", False)
    return asked == whole and not left_out


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups, and before `-m` selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    layers: dict[pytest.Item, str] = {}
    collected = []
    for item in items:
        module = PurePosixPath(item.path.relative_to(root)).as_posix()
        layer = layers[item] = layer_of(module)
        item.add_marker(layer)
        fixtures = getattr(item, "fixturenames", [])  # every fixture the test needs, through other fixtures too
        if "spark" in fixtures:
            item.add_marker("spark")
        group = worker_group(layer, fixtures, module, module_scoped(item))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        markers = frozenset(marker.name for marker in item.iter_markers())
        collected.append(CollectedTest(item.nodeid, module, markers, "spark" in fixtures))
    if collects_every_test_path(config):
        config.stash[COLLECTED] = collected
    items.sort(key=lambda item: send_order(group_of(item), layers[item]))


def group_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker is not None else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a ``--dist loadgroup`` worker, check that pytest-xdist really grouped the tests: when it cannot,
    it distributes them as if ungrouped without a word, and the hil scenarios would run side by side."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        group = group_of(item)
        if group is not None and not item.nodeid.endswith("@" + group):
            raise pytest.UsageError(f"pytest-xdist did not group {item.nodeid} (pyproject.toml: pytest-xdist#1386)")


class UnitLayerViolation(AssertionError):
    """A test of the unit layer reached for the network or a child process."""


@pytest.fixture(autouse=True)
def _unit_layer_stays_offline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("unit") is None:
        yield
        return

    def refuse(what: str):  # type: ignore[no-untyped-def]
        def refused(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise UnitLayerViolation(f"a unit test may not {what}; move {request.node.nodeid} to a higher layer")

        return refused

    monkeypatch.setattr(socket.socket, "bind", refuse("bind a socket"))
    monkeypatch.setattr(socket.socket, "connect", refuse("connect a socket"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connect a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("start a process"))
    yield


