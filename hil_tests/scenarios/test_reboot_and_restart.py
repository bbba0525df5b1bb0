"""Scenario 5: a thermostat reboots, then the gateway restarts; set points changed in the gap still apply.

KEYNOTIFY registrations live in the gateway's memory and die with a connection, so a thermostat must
register again after every reconnect, and catch up (GET) on what changed while it was away:

1. Thermostat power cut: while it is off, its set point changes. After the reboot it registers again,
   applies the missed value (``from get``) and switches its heater; a later change arrives as a
   notification (``from notify``), so the registration is live.
2. Gateway restart (SIGTERM, the clean path; the power cut is scenario 4): the thermostats are frozen
   (SIGSTOP) across it, so the set points written between the gateway's return and their reconnect are
   changes they cannot have been notified of. Each must reconnect, register, apply its value from the
   GET, then follow a notification again; the cloud then sees each one's telemetry reporting it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from appliance.statestore.client import StateStoreClient
from hil_tests.harness import Route, Seen, System, Thermostat, record_when_printed

ROUTES = (Route("alerts", "alerts", priority=0, ttl_s=120), Route("data", "data", priority=1, ttl_s=120))
CATCH_UP_BOUND_S = 5.0  # resume to the missed set point applied: reconnect back-off + register + GET


def change(store: StateStoreClient, bench: System, thermostat: Thermostat, value: str, source: str) -> str:
    """Write a set point and have the timeline record it once the firmware applies it from ``source``."""
    message_id = f"{thermostat.name}/setPoint={value}@{time.monotonic():.3f}"
    record_when_printed(bench.recorder, thermostat, message_id, rf"^set point {float(value)} from {source}$")
    bench.recorder.sent(message_id, None, thermostat.name, set_point=float(value), expected_from=source)
    assert store.set(thermostat.key, value).applied
    return message_id


def test_registrations_come_back_and_changes_made_in_the_gap_apply(system: Callable[..., System]) -> None:
    bench = system(ROUTES, thermostats=4, telemetry_ms=500)
    gateway = bench.gateway

    # 1. Thermostat reboot: the change is made while it is off; flash still holds the default.
    rebooted = bench.thermostats[0]
    rebooted.kill9()
    with StateStoreClient(gateway.host, gateway.port, client_id="hil-operator", timeout=5) as store:
        change(store, bench, rebooted, "15", "get")
        mark = rebooted.mark()
        rebooted.start()
        registered, _ = rebooted.expect(rf"^registered {rebooted.name}\\setPoint$", timeout=15, after=mark)
        rebooted.expect(r"^set point 15.0 from get$", timeout=5, after=mark)
        rebooted.expect(r"^relay off$", timeout=5, after=mark)
        change(store, bench, rebooted, "24", "notify")
        rebooted.expect(r"^set point 24.0 from notify$", timeout=5, after=registered)
        rebooted.expect(r"^relay on$", timeout=5, after=registered)

    # 2. Gateway restart with the thermostats frozen: they cannot see the changes made after it.
    for thermostat in bench.thermostats:
        thermostat.pause()
    try:
        gateway.terminate()
        gateway.start()
        gap_values = {t.name: f"{15 + number * 0.5:.1f}" for number, t in enumerate(bench.thermostats)}
        with StateStoreClient(gateway.host, gateway.port, client_id="hil-operator", timeout=5) as store:
            for thermostat in bench.thermostats:
                change(store, bench, thermostat, gap_values[thermostat.name], "get")
        marks = {t.name: t.mark() for t in bench.thermostats}
    finally:
        for thermostat in bench.thermostats:
            thermostat.resume()
    resumed_at = time.monotonic()
    catch_up = {}
    for thermostat in bench.thermostats:
        after = marks[thermostat.name]
        thermostat.expect(rf"^registered {thermostat.name}\\setPoint$", timeout=15, after=after)
        missed = float(gap_values[thermostat.name])
        _, applied_at = thermostat.expect(rf"^set point {missed} from get$", timeout=5, after=after)
        thermostat.expect(r"^relay off$", timeout=5, after=after)  # rooms near 18 C, set points 15-16.5 C
        catch_up[thermostat.name] = applied_at - resumed_at
    print(f"missed set points applied {sorted(round(s, 2) for s in catch_up.values())} s after the thermostats resumed")
    assert max(catch_up.values()) <= CATCH_UP_BOUND_S, catch_up

    with StateStoreClient(gateway.host, gateway.port, client_id="hil-operator", timeout=5) as store:
        marks = {t.name: t.mark() for t in bench.thermostats}
        for thermostat in bench.thermostats:
            change(store, bench, thermostat, "25", "notify")
    for thermostat in bench.thermostats:
        thermostat.expect(r"^set point 25.0 from notify$", timeout=5, after=marks[thermostat.name])
        thermostat.expect(r"^relay on$", timeout=5, after=marks[thermostat.name])

    def reported(messages: list[Seen]) -> bool:
        return all(any(_reports(m.payload, 25.0) for m in messages if m.device == t.name) for t in bench.thermostats)

    bench.cloud.wait_for(reported, timeout=15, what="telemetry with set point 25 from every thermostat")
    assert not bench.settle(), "nothing here may expire: every TTL outlasts the scenario"


def _reports(payload: bytes, set_point: float) -> bool:
    doc = json.loads(payload)
    return doc.get("set_point") == set_point and doc.get("heater") is True and doc.get("registered") is True
