"""The gateway's root, built from Debian packages as the image is, booted under a real systemd
(``systemd-nspawn --boot``): ``make test-image``. Marked ``image``, so ``make test`` leaves it out.

What only a real boot shows: the units start in order and none fails, first-boot provisioning takes the
boot partition's file in, ``Type=notify`` really gets READY, the hardening of the unit holds (the gateway
runs with it and ``systemd-analyze security`` scores it), systemd's watchdog kills and restarts a gateway
whose loop stopped, ``systemctl stop`` is clean, and a power cut loses nothing that was acknowledged.

The root is cached by a digest of its inputs (``images/gateway/build_root.py``), so only the first run
after a change builds it. Needs root, ``mmdebstrap`` and ``systemd-container`` (``make test-image``
installs them). Figures (wheel, root build, boot to ready) are printed and written to
``build/image-root/timings.txt``. ``GATEWAY_TEST_ROOT=<dir>`` boots a root built before instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.reasoncodes import ReasonCode

from testing import paho_clients
from tests.images.gateway_checks import (
    PROJECT,
    USER,
    acknowledge_before_power_cut,
    assert_nothing_acknowledged_was_lost,
    round_trip,
    state_store,
    write_provisioning,
    write_timings,
)
from tests.images.nspawn import Container, Forwarder

# The first run builds the root (minutes): the fixture gets more than the suite's 120 s per test.
pytestmark = [pytest.mark.image, pytest.mark.timeout(600)]

sys.path.insert(0, str(PROJECT / "images/gateway"))
from build_root import build_root  # noqa: E402

CACHE = PROJECT / "build/image-root"
GATEWAY_ID = "nspawn-042"
#: The test shortens the watchdog to keep CI within its budget; the mechanism (pings from the loop, systemd
#: killing and restarting) is the shipped one, and the shipped value is checked separately.
TEST_WATCHDOG_S = 5
SHIPPED_WATCHDOG_US = 30_000_000
#: ``systemd-analyze security appliance.service`` on bookworm's systemd 252 scores the shipped unit 1.7
#: ("OK"; docs/hardware.md): a change to the unit that weakens it fails here.
EXPOSURE_BOUND = 1.7


def prerequisites_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mmdebstrap, systemd-nspawn)"
    for tool in ("mmdebstrap", "systemd-nspawn", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test-image installs it)"
    return None


@dataclass
class Booted:
    container: Container
    state: Path
    timings: dict[str, float]
    firstboot: dict[str, str] = field(default_factory=dict)
    gateway_at_boot: dict[str, str] = field(default_factory=dict)
    forwarder: Forwarder | None = None

    def mqtt_port(self) -> int:
        """A host port reaching the container's 1883 (made again after a reboot: a new network namespace)."""
        if self.forwarder is None:
            assert self.container.leader is not None
            self.forwarder = Forwarder(self.container.leader, 1883)
        return self.forwarder.port

    def reboot_after(self, cut: bool) -> float:
        if self.forwarder is not None:
            self.forwarder.close()
            self.forwarder = None
        if cut:
            self.container.power_cut()
        else:
            self.container.shutdown()
        return self.container.boot()


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    missing = prerequisites_missing()
    if missing:
        pytest.skip(missing)
    work = tmp_path_factory.mktemp("nspawn")
    timings: dict[str, float] = {}
    given_root = os.environ.get("GATEWAY_TEST_ROOT")  # an already built root, e.g. of an older commit
    if given_root:
        root = Path(given_root)
    else:
        started = time.monotonic()
        # The wheel the way the Makefile builds it (`make image-tree`).
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(work / "wheels"), str(PROJECT)],
            check=True, cwd=PROJECT,
        )
        [wheel] = (work / "wheels").glob("appliance-*.whl")
        timings["wheel"] = time.monotonic() - started
        started = time.monotonic()
        root = build_root(wheel, "amd64", image=False, cache=CACHE)
        timings["root (built or cached)"] = time.monotonic() - started
    state = work / "state"
    (state / "boot").mkdir(parents=True)
    (state / "data").mkdir()
    subprocess.run(["cp", "-a", str(root / "etc/appliance"), str(state / "etc")], check=True)
    write_provisioning(state / "boot", GATEWAY_ID)
    dropin = work / "appliance.service.d"
    dropin.mkdir()
    (dropin / "test-watchdog.conf").write_text(f"[Service]\nWatchdogSec={TEST_WATCHDOG_S}s\n")
    container = Container(root, state, binds_ro={"/etc/systemd/system/appliance.service.d": dropin})
    result = Booted(container, state, timings)
    try:
        timings["boot to running"] = container.boot()
        result.gateway_at_boot = container.show("appliance.service", "ActiveState", "SubState", "NRestarts")
        result.firstboot = container.show("appliance-firstboot.service", "Result", "ActiveState", "ExecMainStatus")
        result.firstboot["journal"] = container.journal("appliance-firstboot.service")
        write_timings(timings, CACHE / "timings.txt")
        yield result
    finally:
        if result.forwarder is not None:
            result.forwarder.close()
        container.shutdown()
        write_timings(timings, CACHE / "timings.txt")


def wait_active(container: Container, timeout: float = 60.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        shown = container.show("appliance.service", "ActiveState", "SubState", "MainPID", "NRestarts")
        if shown["ActiveState"] == "active" and shown["SubState"] == "running":
            return shown
        assert time.monotonic() < deadline, shown
        time.sleep(0.2)


def test_boots_to_running_with_no_failed_units(booted: Booted) -> None:
    container = booted.container
    assert container.run("systemctl", "is-system-running", check=False).stdout.strip() == "running"
    assert container.run("systemctl", "list-units", "--failed", "--plain", "--no-legend").stdout.strip() == ""
    # A gateway that exits at start is not "failed" while Restart= retries it, and the boot still ends
    # "running": READY on the first attempt is what says the boot really brought it up.
    assert booted.gateway_at_boot == {"ActiveState": "active", "SubState": "running", "NRestarts": "0"}, booted.gateway_at_boot


def test_the_gateway_is_ready_through_sd_notify_as_its_own_user(booted: Booted) -> None:
    container = booted.container
    wait_active(container)
    shown = container.show("appliance.service", "Type", "StatusText", "MainPID", "WatchdogUSec", "NotifyAccess")
    assert shown["Type"] == "notify" and shown["NotifyAccess"] == "main"
    assert shown["StatusText"] == "listening on tcp://0.0.0.0:1883"  # sent with READY=1
    status = container.run("cat", f"/proc/{shown['MainPID']}/status").stdout
    uid = container.run("id", "-u", "appliance").stdout.strip()
    assert re.search(rf"^Uid:\s+{uid}\s+{uid}\s", status, re.M), status
    # A writable working directory (lgpio makes FIFOs there), in RAM.
    assert container.run("readlink", f"/proc/{shown['MainPID']}/cwd").stdout.strip() == "/run/appliance"
    journal = container.journal("appliance.service")
    assert f"appliance ready: gateway {GATEWAY_ID} listening on tcp://0.0.0.0:1883" in journal, journal
    # The shipped unit's watchdog; this test runs it shorter (drop-in), the shipped file is unchanged.
    assert "WatchdogSec=30s" in container.run("cat", "/usr/lib/systemd/system/appliance.service").stdout


def test_first_boot_provisioning_took_the_file_in_and_removed_it(booted: Booted) -> None:
    assert booted.firstboot["Result"] == "success" and booted.firstboot["ExecMainStatus"] == "0", booted.firstboot
    assert f"provisioned gateway {GATEWAY_ID}" in booted.firstboot["journal"]
    assert sorted(path.name for path in (booted.state / "boot").iterdir()) == []  # credentials gone from the FAT side
    container = booted.container
    assert f'id = "{GATEWAY_ID}"' in container.run("cat", "/etc/appliance/gateway.toml").stdout
    assert container.run("grep", "-c", f"^{USER}:", "/etc/appliance/passwd").stdout.strip() == "1"


def test_file_modes_and_owners(booted: Booted) -> None:
    container = booted.container
    wait_active(container)
    paths = [
        "/etc/appliance", "/etc/appliance/gateway.toml", "/etc/appliance/passwd",
        "/var/lib/appliance", "/var/lib/appliance/broker.db", "/var/lib/appliance/statestore.db",
        "/opt/appliance/venv/bin/appliance", "/usr/local/sbin/appliance-firstboot",
    ]
    output = container.run("stat", "-c", "%n %a %U:%G", *paths).stdout
    found = {name: rest for name, rest in (line.split(" ", 1) for line in output.splitlines())}
    assert found == {
        "/etc/appliance": "755 root:appliance",
        "/etc/appliance/gateway.toml": "640 root:appliance",
        "/etc/appliance/passwd": "640 root:appliance",
        "/var/lib/appliance": "750 appliance:appliance",
        "/var/lib/appliance/broker.db": "640 appliance:appliance",
        "/var/lib/appliance/statestore.db": "640 appliance:appliance",
        "/opt/appliance/venv/bin/appliance": "755 root:root",
        "/usr/local/sbin/appliance-firstboot": "755 root:root",
    }


def test_the_units_exposure_score_is_at_or_under_the_documented_bound(booted: Booted) -> None:
    output = booted.container.run("systemd-analyze", "security", "--no-pager", "appliance.service").stdout
    match = re.search(r"Overall exposure level for appliance\.service: (\d+\.\d+)", output)
    assert match, output
    print(f"\nexposure of appliance.service: {match.group(1)}")
    assert float(match.group(1)) <= EXPOSURE_BOUND, output


def test_mqtt_and_the_state_store_answer_from_the_host(booted: Booted) -> None:
    wait_active(booted.container)
    port = booted.mqtt_port()
    assert round_trip(port, "check/loop", b"through the container", timeout=10)
    with state_store(port, "host-statestore", timeout=10) as store:
        assert store.set(b"site", b"nspawn").applied
        assert store.get(b"site").value == b"nspawn"
    refused = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="anonymous", protocol=mqtt.MQTTv5)
    codes: list[ReasonCode] = []
    done = threading.Event()

    def on_connect(_client: mqtt.Client, _userdata: object, _flags: object, reason: ReasonCode, _properties: object) -> None:
        codes.append(reason)
        done.set()

    refused.on_connect = on_connect
    refused.connect("127.0.0.1", port)
    refused.loop_start()
    try:
        assert done.wait(10) and codes[0].is_failure  # the image allows no anonymous client
    finally:
        paho_clients.close(refused)


def test_systemd_watchdog_restarts_a_gateway_whose_loop_stopped(booted: Booted) -> None:
    container = booted.container
    before = wait_active(container)
    assert container.show("appliance.service", "WatchdogUSec")["WatchdogUSec"] == f"{TEST_WATCHDOG_S}s"
    restart_s = 5  # RestartSec= of the shipped unit
    stopped_at = time.monotonic()
    container.run("systemctl", "kill", "--kill-whom=main", "--signal=SIGSTOP", "appliance.service")
    deadline = stopped_at + TEST_WATCHDOG_S + restart_s + 20  # + starting again on a loaded machine
    while True:
        shown = container.show("appliance.service", "ActiveState", "SubState", "MainPID", "NRestarts")
        if shown["MainPID"] not in ("0", before["MainPID"]) and shown["SubState"] == "running":
            break
        assert time.monotonic() < deadline, shown
        time.sleep(0.2)
    elapsed = time.monotonic() - stopped_at
    print(f"\nwatchdog: stopped loop to a new READY gateway in {elapsed:.1f} s (WatchdogSec={TEST_WATCHDOG_S}s, RestartSec={restart_s}s)")
    assert elapsed >= TEST_WATCHDOG_S
    assert int(shown["NRestarts"]) == int(before["NRestarts"]) + 1
    assert "Watchdog timeout" in container.journal("appliance.service")


def test_systemctl_stop_is_clean(booted: Booted) -> None:
    container = booted.container
    wait_active(container)
    stops_before = container.journal("appliance.service").count("INFO appliance: stopped")
    started = time.monotonic()
    container.run("systemctl", "stop", "appliance.service")
    took = time.monotonic() - started
    shown = container.show("appliance.service", "ActiveState", "Result", "ExecMainStatus", "ExecMainCode")
    journal = container.journal("appliance.service")
    container.run("systemctl", "start", "appliance.service")
    # Exited by itself with status 0 (ExecMainCode 1 = CLD_EXITED), not killed after TimeoutStopSec.
    assert shown == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0", "ExecMainCode": "1"}, shown
    assert took < 10
    assert journal.count("INFO appliance: stopped") == stops_before + 1, journal


def test_a_power_cut_loses_no_acknowledged_publish_or_set(booted: Booted) -> None:
    container = booted.container
    wait_active(container)
    acknowledge_before_power_cut(booted.mqtt_port(), timeout=10)
    booted.timings["boot to running after a power cut"] = booted.reboot_after(cut=True)
    wait_active(container)
    assert_nothing_acknowledged_was_lost(booted.mqtt_port(), timeout=20)
