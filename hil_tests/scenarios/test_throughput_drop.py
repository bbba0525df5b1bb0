"""Scenario 2: the uplink drops to 9.6 kbit/s under load, then comes back.

Four thermostats send telemetry every 250 ms: two of them on a priority 1 route, two on a priority 5
"bulk" route, far more than 9.6 kbit/s carries (about 2.4 messages a second). Sensor-failure alerts
(priority 0) are raised one after the other while the link is slow, each once the previous one has
arrived: they must keep arriving within ``ALERT_BOUND_S`` while the priority 1 backlog grows. When the
rate goes back up, the backlog must drain in priority order: every priority 1 message queued during the
slow phase before any priority 5 one, and each priority in its enqueue order (``gw-message-id`` sequence).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from appliance.forwarding.config import UpstreamConfig
from hil_tests.harness import Route, Seen, System, raise_alert
from hil_tests.rig.client import RigClient
from hil_tests.rig.shaping import wire_bytes

pytestmark = pytest.mark.forwarding  # each upstream format; in `make test`: see the note below the routes

SLOW_LINK_BPS = 9600
ALERTS = 8
ALERT_BOUND_S = 3.0
# The cloud broker, not the gateway, sets the floor here. Whatever the gateway does, mosquitto closes an
# upstream client from which no whole packet arrived within 1.5 x keep-alive (in whole seconds), and on the
# slow link a full batch PUBLISH takes `BATCH_ON_SLOW_LINK_S` to cross (1.79 s for 2,048 bytes at 9.6
# kbit/s). docs/forwarding.md "Keep-alive on a slow link" therefore asks for batches below 1.5 x keep-alive
# of the slowest link; this is the smallest whole keep-alive that rule allows (2 s here). A 1 s keep-alive
# broke it: in issue 16's bridge-bench runs mosquitto dropped the gateway twice for "exceeded timeout".
# It is still far shorter than the queueing delay right after the drop (a window sized for the fast link,
# seconds at 9.6 kbit/s): the bridge must not take the slow link for a dead one
# (appliance/forwarding/liveness.py; PUBACKs more than a keep-alive apart: tests/forwarding/test_liveness.py).
BATCH_ON_SLOW_LINK_S = wire_bytes(UpstreamConfig().batch_max_bytes) * 8 / SLOW_LINK_BPS
CLOUD_TOLERANCE = 1.5  # keep-alives the cloud broker waits for a packet (MQTT 5 section 3.1.2.10)
UPLINK_KEEPALIVE_S = math.floor(BATCH_ON_SLOW_LINK_S / CLOUD_TOLERANCE) + 1
ROUTES = (
    Route("alerts", "alerts", priority=0, ttl_s=120),
    Route("control", "data", priority=1, ttl_s=120, devices=("thermostat-00", "thermostat-01")),
    Route("bulk", "data", priority=5, ttl_s=120, devices=("thermostat-02", "thermostat-03")),
)

# In `make test` again (issue 26 section 9), on the bench `make test` runs it on (the userspace one; the netns
# and bridge benches run it in `make test-slow`). Measured at load, 2026-11-27, on 2 cores shared by ~7
# engineers, each run both formats unless noted, the alert bound 3 s:
#   userspace  30 runs, load 3.1-18.7: 0 failures; max 2.42 s (message), 2.81 s (batch, load 10.8); at
#              load 3-6 (10 runs, about a quiet machine's `make test`) max 2.21 s; the steady alerts 1.3 s
#              (message) and 0.9 s (batch); the slow ones are the first after the drop
#   netns       8 runs, load 6.7-11.9: 1 failure, 4.52 s (message), before its gateway namespace got the
#              image's retransmission floor as the bridge bench's has (hil_tests/conftest.py); 7 after: max 2.43 s
#   bridge      8 runs relay and 8 plain (message only), load 6.0-12.5: 0 failures, max 1.84 and 1.75 s
# The margin on the userspace bench is 0.79 s at load 3-6 and 0.19 s at worst (load 10.8): the slowest alert
# is the one raised while a batch sized for the fast link (2,048 bytes, 1.79 s at 9.6 kbit/s) is still on
# the wire. A run that misses it at a load far above a quiet machine's reads as such in the history's
# trend (hil_tests/history.py).


def test_alerts_overtake_a_growing_backlog_that_drains_in_priority_order(
    system: Callable[..., System], rig: RigClient
) -> None:
    bench = system(ROUTES, thermostats=4, telemetry_ms=250, keepalive_s=UPLINK_KEEPALIVE_S)
    names = [t.name for t in bench.thermostats]
    bench.cloud.wait_for(lambda got: {m.device for m in got} >= set(names), timeout=15, what="telemetry of every thermostat")

    rig.rate(SLOW_LINK_BPS)
    alert_latencies: list[float] = []
    backlog_at_alert: list[int] = []
    for number in range(ALERTS):
        thermostat = bench.thermostats[number % len(bench.thermostats)]
        before = _alerts_of(bench.tap.snapshot(), thermostat.name)
        raise_alert(thermostat)
        tapped = bench.tap.wait_for(
            lambda got, name=thermostat.name, before=before: len(_alerts_of(got, name)) > len(before),
            timeout=10, what=f"alert {number} at the gateway",
        )
        alert = _alerts_of(tapped, thermostat.name)[-1]
        arrived = bench.cloud.wait_for(
            lambda got, key=alert.key: any(m.key == key for m in got), timeout=30, what=f"alert {alert.key} at the cloud"
        )
        alert_latencies.append(next(m.at for m in arrived if m.key == alert.key) - alert.at)
        backlog_at_alert.append(len(_pending(bench.tap.snapshot(), arrived, priority=1)))

    rig.rate(0)
    reconnects = bench.gateway.output().count("upstream connected to") - 1
    print(f"upstream reconnects while the link was slow: {reconnects}")
    tapped, arrived = bench.tap.snapshot(), bench.cloud.snapshot()
    backlog = {priority: _pending(tapped, arrived, priority) for priority in (1, 5)}
    print(f"alert latencies at {SLOW_LINK_BPS} bit/s: {[round(s, 2) for s in alert_latencies]} s; "
          f"priority 1 backlog at each alert: {backlog_at_alert}; "
          f"backlog when the rate went up: P1={len(backlog[1])} P5={len(backlog[5])}")
    assert reconnects == 0, "the slow link was taken for a dead one"
    assert max(alert_latencies) <= ALERT_BOUND_S, alert_latencies
    assert backlog_at_alert[-1] >= backlog_at_alert[0] + 15, f"the priority 1 backlog did not grow: {backlog_at_alert}"
    assert len(backlog[5]) >= 15, "the bulk route should have starved while the link was slow"

    waiting = {m.key for queue in backlog.values() for m in queue}
    arrived = bench.cloud.wait_for(lambda got: waiting <= {m.key for m in got}, timeout=60, what="the backlog drained")
    first_copies: dict[str, Seen] = {}
    for message in arrived:
        if message.key in waiting:
            first_copies.setdefault(message.key, message)
    drained = sorted(first_copies.values(), key=lambda m: m.at)
    priorities = [m.priority for m in drained]
    tapped_at = {m.key: m.at for m in tapped}
    oldest_wait = max(m.at - tapped_at[m.key] for m in drained if m.priority == 1)
    print(f"drain order by priority: {_runs(priorities)}; the oldest priority 1 message waited {oldest_wait:.2f} s")
    assert oldest_wait > max(alert_latencies), "the alerts should have overtaken queued priority 1 data"
    assert priorities == sorted(priorities), f"the backlog did not drain in priority order: {_runs(priorities)}"
    for priority in (1, 5):
        sequence = [_sequence(m) for m in drained if m.priority == priority]
        assert sequence == sorted(sequence), f"priority {priority} drained out of enqueue order"
    assert not bench.settle(), "nothing here may expire: every TTL outlasts the scenario"


def _alerts_of(messages: list[Seen], device: str) -> list[Seen]:
    return [m for m in messages if m.device == device and m.output == "alerts"]


def _pending(tapped: list[Seen], arrived: list[Seen], priority: int) -> list[Seen]:
    """Messages of ``priority`` that entered the gateway and have not reached the cloud."""
    delivered = {m.key for m in arrived}
    return [m for m in tapped if m.priority == priority and m.key not in delivered]


def _sequence(message: Seen) -> int:
    """The gateway's enqueue sequence, the number in ``gw-message-id`` = ``{gateway}:{sequence}``."""
    return int(message.gw_message_id.rsplit(":", 1)[1])


def _runs(priorities: list[int | None]) -> list[tuple[int | None, int]]:
    """Run-length form (priority, count) of an arrival order, short enough for a failure message."""
    runs: list[tuple[int | None, int]] = []
    for priority in priorities:
        if runs and runs[-1][0] == priority:
            runs[-1] = (priority, runs[-1][1] + 1)
        else:
            runs.append((priority, 1))
    return runs
