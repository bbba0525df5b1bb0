"""Scenario 6: active/standby controllers on the cloud side of the gateway, a lock key and fencing tokens.

Two controller processes (`hil_tests.scenarios.controller`) compete for a lock key (``SET NEX PX``,
1.5 s TTL); the holder writes a thermostat's set point with the lock's version as fencing token, and the
thermostat heats to whatever the store holds. The active one is killed (``kill -9``, no release):

* the standby stays standby while the active one renews, and takes over only after the lease expired:
  its acquisition is answered no earlier than the old holder's last lease request plus the TTL, and no
  later than the TTL plus ``TAKEOVER_SLACK_S`` after the kill;
* a write with the old holder's fencing token (a delayed request of the dead controller, replayed by the
  test) is refused with "lower version", and neither the store's history of the key nor the thermostat
  ever shows it: every value the key takes after the standby's first write is the standby's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from appliance.statestore.client import (
    FencingTokenLower,
    Notification,
    StateStoreClient,
)
from appliance.statestore.hlc import Hlc
from hil_tests.harness import Recorder, Route, System
from testing.processes import ROOT
from testing.waiting import wait_on

LEASE_TTL_MS = 1500
TAKEOVER_SLACK_S = 1.5
#: The store keeps times in whole milliseconds (``wall_ms``: its clock read and truncated), so a lease
#: renewed at 12.3459 s expires at 12.345 + TTL: up to a millisecond before the TTL has passed since the
#: renewal by the controllers' clock (the same ``time.time()``, read as floats). The lower bound allows that
#: step and nothing more (the store's own exactness is tests/statestore/test_store.py's, on a fake clock).
STORE_CLOCK_STEP_S = 0.001
RENEWALS_WATCHED = 5  # the standby must stay standby over more than one TTL of renewals
STALE_VALUE = "9.50"
ROUTES = (Route("data", "data", priority=1, ttl_s=120),)


class Controller:
    """A controller process and the JSON events it prints; writes it starts go into the timeline."""

    def __init__(self, name: str, gateway: tuple[str, int], key: str, base: float, recorder: Recorder, log: Path) -> None:
        self.name = name
        self.recorder = recorder
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self._stderr = open(log, "w")  # noqa: SIM115  # the controller process writes it for its whole life
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hil_tests.scenarios.controller", "--host", gateway[0], "--port", str(gateway[1]),
             "--name", name, "--key", key, "--base", str(base), "--ttl-ms", str(LEASE_TTL_MS)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            event = json.loads(line)
            if event["event"] == "write":
                self.recorder.sent(event["value"], None, self.name, token=event["token"])
            with self.cond:
                self.events.append(event)
                self.cond.notify_all()

    def wait_for(self, kind: str, count: int = 1, timeout: float = 15.0) -> dict[str, Any]:
        """The ``count``-th event of ``kind``."""
        with self.cond:
            wait_on(self.cond, lambda: len(self.of(kind)) >= count, timeout, f"controller {self.name}: {count} x {kind}")
            return self.of(kind)[count - 1]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def kill9(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._stderr.close()


class KeyHistory:
    """Every value a key takes, in commit order, from the store's KEYNOTIFY notifications."""

    def __init__(self, recorder: Recorder, device: str) -> None:
        self.values: list[str] = []
        self.cond = threading.Condition()
        self.recorder, self.device = recorder, device

    def __call__(self, note: Notification) -> None:
        if note.value is None:
            return
        value = note.value.decode()
        self.recorder.received(value, None, self.device, version=str(note.version))
        with self.cond:
            self.values.append(value)
            self.cond.notify_all()


def writer_of(value: str) -> str:
    return {"21": "A", "23": "B"}.get(value.split(".")[0], "?")


def test_standby_takes_over_after_the_lease_and_a_stale_write_is_fenced_off(
    system: Callable[..., System], tmp_path: Path
) -> None:
    bench = system(ROUTES, thermostats=1, telemetry_ms=1000)
    thermostat = bench.thermostats[0]
    gateway = bench.gateway
    controllers: list[Controller] = []
    endpoint = (gateway.host, gateway.port)
    with StateStoreClient(gateway.host, gateway.port, client_id="hil-auditor", timeout=5) as auditor:
        history = KeyHistory(bench.recorder, thermostat.name)
        auditor.keynotify(thermostat.key, history)
        try:
            active = Controller("A", endpoint, thermostat.key, 21, bench.recorder, tmp_path / "controller-A.log")
            controllers.append(active)
            active.wait_for("active")
            standby = Controller("B", endpoint, thermostat.key, 23, bench.recorder, tmp_path / "controller-B.log")
            controllers.append(standby)
            standby.wait_for("standby")
            active.wait_for("renewed", RENEWALS_WATCHED)
            assert not standby.of("active"), "the standby took a lease that was being renewed"
            thermostat.expect(r"^set point 21\.\d+ from notify$", timeout=5)

            # Killed between writes (each renewal is followed by a write, then a pause of TTL/4), so every
            # write it started is answered: the timeline's accounting of writes stays exact.
            active.wait_for("wrote", RENEWALS_WATCHED + 1)
            killed_at = time.time()
            active.kill9()
            last_lease_request = max(e["requested"] for e in active.events if e["event"] in ("active", "renewed"))
            old_token = Hlc.parse([e for e in active.events if e["event"] in ("active", "renewed")][-1]["token"])
            took_over = standby.wait_for("active", timeout=LEASE_TTL_MS / 1000 + 10)
            first_write = standby.wait_for("wrote")
            standby.kill9()  # between writes too; the store keeps its fencing token on the key
            expired_after = took_over["t"] - last_lease_request
            takeover = took_over["t"] - killed_at
            print(f"standby active {takeover:.3f} s after the kill, {expired_after:.3f} s after the old holder's "
                  f"last lease request (TTL {LEASE_TTL_MS / 1000} s)")
            assert expired_after >= LEASE_TTL_MS / 1000 - STORE_CLOCK_STEP_S, \
                "the standby got the lock before the old lease expired"
            assert takeover <= LEASE_TTL_MS / 1000 + TAKEOVER_SLACK_S

            with pytest.raises(FencingTokenLower):
                auditor.set(thermostat.key, STALE_VALUE, fencing_token=old_token)
            current = auditor.get(thermostat.key).value
            assert current is not None and writer_of(current.decode()) == "B", current
            with history.cond:
                wait_on(history.cond, lambda: first_write["value"] in history.values, 5, "B's first write notified")
                values = list(history.values)
        finally:
            for controller in controllers:
                controller.kill9()
    writers = [writer_of(value) for value in values]
    print(f"key history by writer: {writers.count('A')} x A then {writers.count('B')} x B")
    assert STALE_VALUE not in values
    assert writers == sorted(writers) and set(writers) == {"A", "B"}, f"writes interleaved: {values}"
    thermostat.expect(r"^set point 23\.\d+ from notify$", timeout=5)
    assert f"set point {float(STALE_VALUE)} from" not in "\n".join(thermostat.lines)
    assert not bench.settle(), "the thermostat's telemetry must all reach the cloud"
