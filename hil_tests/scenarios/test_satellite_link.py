"""Scenario 7: a satellite uplink: 600 ms each way, 256 kbit/s, 2 % loss, and outages of 30 to 120 s.

Four thermostats publish telemetry every 250 ms (priority 1) while the link is a geostationary hop. Then
the link goes DOWN for the outage and comes back: the backlog of the outage must drain, and it must drain
*fast*. On a 1.2 s round trip a sender that waits for each acknowledgement before the next message moves
one message per round trip; the gateway sizes its forwarding window by the measured bandwidth-delay
product (`appliance/forwarding/window.py`), so many messages are in flight per round trip and the link
stays busy. The scenario shows it: it measures the drain's rate at the cloud and compares it with the
rate of one message per round trip, and with RATE. An alert raised during the outage arrives after UP
ahead of the backlog, and nothing is lost.

TCP on a 1.2 s round trip with 2 % loss carries far less than 256 kbit/s (about MSS / RTT x 1.22 / sqrt(p),
some 80 kbit/s, on a kernel-shaped bench with real drops), so the bound is against one message per round
trip, not against RATE; both figures are printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from hil_tests.harness import Route, Seen, System, raise_alert
from hil_tests.rig.client import RigClient

pytestmark = [pytest.mark.forwarding, pytest.mark.slow]  # an outage of 30-120 s each, in each upstream format

LINK_BPS = 256_000
ONE_WAY_DELAY_MS = 600
LOSS_PCT = 2
ROUND_TRIP_S = 2 * ONE_WAY_DELAY_MS / 1000
# The drain must move at least this many times what one message per round trip moves.
FASTER_THAN_STOP_AND_WAIT = 10
BACKLOG_AT_LEAST = 100
ROUTES = (Route("alerts", "alerts", priority=0, ttl_s=900), Route("data", "data", priority=1, ttl_s=900))
# Longer than the link's worst queueing + round trip, so the slow link is not taken for a dead one; an
# outage of 30 s or more is still noticed (after 1.5 keep-alives) and the uplink reconnects after UP.
UPLINK_KEEPALIVE_S = 10


@pytest.mark.timeout(600)  # an outage of up to 120 s, its drain at 1.2 s round trips, and settling
@pytest.mark.parametrize("outage_s", [30, 120], ids=lambda s: f"outage{s}s")
def test_a_satellite_backlog_drains_with_the_window_full_and_alerts_first(
    system: Callable[..., System], rig: RigClient, outage_s: int
) -> None:
    bench = system(ROUTES, thermostats=4, telemetry_ms=250, keepalive_s=UPLINK_KEEPALIVE_S)
    rig.rate(LINK_BPS)
    rig.delay(ONE_WAY_DELAY_MS)
    rig.loss(LOSS_PCT)
    names = {t.name for t in bench.thermostats}
    bench.cloud.wait_for(lambda got: {m.device for m in got} >= names, timeout=30, what="telemetry over the satellite")

    rig.down()
    down_at = time.monotonic()
    _wait_seconds(bench, outage_s / 2)
    alert_before = {m.key for m in bench.tap.snapshot() if m.output == "alerts"}
    raise_alert(bench.thermostats[0])
    _wait_seconds(bench, outage_s / 2)
    tapped = bench.tap.snapshot()
    arrived = {m.key for m in bench.cloud.snapshot()}
    backlog = [m for m in tapped if m.key not in arrived and m.priority == 1 and m.at >= down_at]
    alerts = [m for m in tapped if m.output == "alerts" and m.key not in alert_before]
    assert len(backlog) >= BACKLOG_AT_LEAST, f"only {len(backlog)} messages queued during the outage"
    assert alerts, "the alert raised during the outage did not reach the gateway"
    rig.up()
    up_at = time.monotonic()

    waiting = {m.key for m in backlog} | {m.key for m in alerts}
    got = bench.cloud.wait_for(lambda got: waiting <= {m.key for m in got}, timeout=outage_s * 3 + 120,
                               what="the outage backlog at the cloud")
    first: dict[str, Seen] = {}
    for message in got:
        if message.key in waiting:
            first.setdefault(message.key, message)
    drained = sorted((first[m.key] for m in backlog), key=lambda m: m.at)
    alert_at = min(first[m.key].at for m in alerts)
    start, end = drained[0].at, drained[-1].at
    payload_bits = sum(len(m.payload) for m in drained) * 8
    rate_bps = payload_bits / max(end - start, 1e-3)
    messages_per_s = (len(drained) - 1) / max(end - start, 1e-3)
    stop_and_wait_per_s = 1 / ROUND_TRIP_S
    print(f"satellite ({ONE_WAY_DELAY_MS} ms, {LINK_BPS} bit/s, {LOSS_PCT} % loss), outage {outage_s} s: "
          f"backlog {len(drained)} messages drained in {end - start:.1f} s after the first arrival "
          f"({start - up_at:.1f} s after UP): {messages_per_s:.1f} messages/s, payload {rate_bps / 1000:.1f} kbit/s "
          f"({100 * rate_bps / LINK_BPS:.0f} % of RATE); one message per round trip would be "
          f"{stop_and_wait_per_s:.2f}/s; alert after UP {alert_at - up_at:.1f} s")
    assert alert_at <= drained[len(drained) // 2].at, "the outage's alert should overtake the bulk of the backlog"
    assert messages_per_s >= FASTER_THAN_STOP_AND_WAIT * stop_and_wait_per_s, (
        f"{messages_per_s:.2f} messages/s: the window does not keep the link busy"
    )
    assert not bench.settle(timeout=120), "nothing may expire: every TTL outlasts the scenario"


def _wait_seconds(bench: System, seconds: float) -> None:
    """Let ``seconds`` of telemetry enter the gateway: wait until a message stamped that late is tapped."""
    until = time.monotonic() + seconds  # the taps stamp ``Seen.at`` with this clock
    bench.tap.wait_for(lambda got: any(m.at >= until for m in got), timeout=seconds + 30,
                       what=f"{seconds:.0f} s of telemetry into the gateway")
