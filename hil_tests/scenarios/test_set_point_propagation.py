"""Scenario 1: set points changed from the cloud side through the gateway's state store reach 20 heaters.

An operator's controller (the project's state store client, connected to the gateway) writes each
thermostat's ``<name>\\setPoint`` key; the thermostat gets the KEYNOTIFY notification and switches its
relay. The latency is measured per thermostat from just before the SET request to the moment the
firmware prints the relay switch, and the cloud must then see each thermostat's telemetry report the new
set point and heater state through the uplink.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from appliance.statestore.client import StateStoreClient
from appliance.statestore.client.results import set_result
from appliance.statestore.commands import SetCommand
from hil_tests.harness import Route, Seen, System, record_when_printed

THERMOSTATS = 20
HEATER_BOUND_S = 2.0  # per thermostat, SET request to relay switch
ROUTES = (Route("data", "data", priority=1, ttl_s=60), Route("alerts", "alerts", priority=0, ttl_s=60))


def test_every_heater_follows_its_set_point_within_the_bound(system: Callable[..., System]) -> None:
    bench = system(ROUTES, thermostats=THERMOSTATS, telemetry_ms=1000)
    with StateStoreClient(bench.gateway.host, bench.gateway.port, client_id="hil-operator", timeout=5) as store:
        # 18 C rooms heat towards the default 20 C; 15 C switches every heater off, 25 C on again.
        for value, relay in (("15", "off"), ("25", "on")):
            marks = {t.name: t.mark() for t in bench.thermostats}
            requested_at: dict[str, float] = {}
            pending = []
            for thermostat in bench.thermostats:
                message_id = f"{thermostat.name}/setPoint={value}"
                record_when_printed(bench.recorder, thermostat, message_id, rf"^relay {relay}$")
                requested_at[thermostat.name] = time.monotonic()
                bench.recorder.sent(message_id, None, thermostat.name, set_point=float(value))
                # Submitted without waiting for each answer: an operator changing a whole site at once.
                pending.append(store.submit(SetCommand(thermostat.key.encode(), value.encode()).encode()))
            assert all(set_result(store.wait(request)).applied for request in pending)
            latencies = {}
            for thermostat in bench.thermostats:
                _, switched_at = thermostat.expect(rf"^relay {relay}$", timeout=10, after=marks[thermostat.name])
                latencies[thermostat.name] = switched_at - requested_at[thermostat.name]
            ordered = sorted(latencies.values())
            print(f"set point {value} C: relay {relay} after median {ordered[len(ordered) // 2]:.3f} s, "
                  f"max {ordered[-1]:.3f} s")
            slow = {name: round(s, 3) for name, s in latencies.items() if s > HEATER_BOUND_S}
            assert not slow, f"heaters slower than {HEATER_BOUND_S} s to follow {value} C: {slow}"

    # End to end through the uplink: every thermostat reports the new set point and a heating relay.
    def reported(messages: list[Seen]) -> bool:
        return all(any(_reports(m.payload, 25.0, True) for m in messages if m.device == t.name)
                   for t in bench.thermostats)

    bench.cloud.wait_for(reported, timeout=15, what="telemetry with set point 25 from every thermostat")
    assert not bench.settle(), "no telemetry may be lost or expire on a healthy uplink"


def _reports(payload: bytes, set_point: float, heater: bool) -> bool:
    doc = json.loads(payload)
    return doc.get("set_point") == set_point and doc.get("heater") is heater and doc.get("set_point_source") == "notify"

