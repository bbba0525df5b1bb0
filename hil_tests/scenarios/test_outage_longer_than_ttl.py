"""Scenario 3: the uplink is down for longer than the data's time-to-live.

Telemetry goes upstream at priority 1 with a 2 s TTL, alerts at priority 0 with a 120 s TTL. The rig takes
the link DOWN; the gateway notices (upstream keep-alive of 1 s) while the thermostats keep publishing and
raise alerts. The link stays down until the gateway's cleanup has expired telemetry queued during the
outage, then comes UP. Then:

* telemetry that entered the gateway during the outage and whose TTL passed before UP never arrives (its
  expiry is at most its arrival at the gateway plus the TTL, so the check needs no gateway clock);
* the gateway never sends a message after its expiry (``gw-sent-ms`` <= ``gw-enqueued-ms`` + TTL);
* every alert raised during the outage arrives after UP, none lost;
* duplicates (by ``gw-message-id``) exist only for messages that were in flight when the link broke: the
  at-least-once window. The userspace rig stalls open connections, so such a batch reaches the cloud
  after UP although the gateway retries it on a new connection.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import pytest

from hil_tests.harness import (
    Route,
    Seen,
    System,
    expired_by_cleanup,
    gateway_log,
    identity_problems,
    raise_alert,
    wait_for_gateway_log,
)
from hil_tests.rig.client import RigClient

pytestmark = pytest.mark.forwarding  # runs in each upstream format of the bench

DATA_TTL_S = 2
LINK_DELAY_MS = 150
EXPIRED_DURING_OUTAGE = 5  # the outage lasts until at least this many outage messages have expired
ROUTES = (Route("alerts", "alerts", priority=0, ttl_s=120), Route("data", "data", priority=1, ttl_s=DATA_TTL_S))


def test_expired_data_is_never_delivered_and_alerts_survive_the_outage(
    system: Callable[..., System], rig: RigClient
) -> None:
    bench = system(ROUTES, thermostats=3, telemetry_ms=250)
    # A long-haul link: with 300 ms round trips a batch is nearly always in flight when the link breaks.
    rig.delay(LINK_DELAY_MS)
    bench.cloud.wait_for(lambda got: len({m.device for m in got}) == 3, timeout=15, what="telemetry of every thermostat")

    # An alert goes out just before the link breaks: most likely it is in flight then, the case that
    # at-least-once delivery answers with a retry (and the cloud may see it twice).
    alerts_before = {m.key for m in bench.tap.snapshot() if m.output == "alerts"}
    raise_alert(bench.thermostats[0])
    bench.tap.wait_for(lambda got: any(m.output == "alerts" and m.key not in alerts_before for m in got),
                       timeout=10, what="the last alert before the outage at the gateway")
    log_mark = len(gateway_log(bench.gateway))
    rig.down()
    wait_for_gateway_log(bench.gateway, lambda lines: any("upstream disconnected" in line for line in lines[log_mark:]),
                         timeout=10, what="the gateway noticing the dead uplink")
    detected_ms = int(time.time() * 1000)
    cleanup_mark = len(gateway_log(bench.gateway))
    # Nothing can reach the cloud now, so what is queued at this moment is exact.
    queued_before = len([m for m in bench.tap.snapshot() if m.priority == 1 and m.key not in bench.cloud.keys()])  # noqa: SIM118  # a collector, not a dict
    tap_mark = len(bench.tap.snapshot())

    alerts_before = {m.key for m in bench.tap.snapshot() if m.output == "alerts"}
    for thermostat in bench.thermostats:
        raise_alert(thermostat)
    outage_alerts = bench.tap.wait_for(
        lambda got: len({m.key for m in got if m.output == "alerts"} - alerts_before) == len(bench.thermostats),
        timeout=10, what="the outage's alerts at the gateway",
    )
    outage_alerts = [m for m in outage_alerts if m.output == "alerts" and m.key not in alerts_before]
    # Data expires in queue order (one TTL), so once cleanup has removed everything queued before the
    # outage plus N more, the first N messages of the outage have expired; and N of them must be past
    # their TTL by our own reckoning too (cleanup also counts a batch that reached the cloud unacknowledged).
    def outage_data_expired(lines: list[str]) -> bool:
        now = time.monotonic()
        past_ttl = [m for m in bench.tap.snapshot()[tap_mark:] if m.priority == 1 and m.at + DATA_TTL_S < now]
        removed = expired_by_cleanup(lines[cleanup_mark:], "upstream_Pri1")
        return len(past_ttl) >= EXPIRED_DURING_OUTAGE and removed >= queued_before + EXPIRED_DURING_OUTAGE

    wait_for_gateway_log(bench.gateway, outage_data_expired, timeout=20,
                         what=f"{EXPIRED_DURING_OUTAGE} outage messages expired by the gateway's cleanup")
    rig.up()
    up_at = time.monotonic()

    outage_data = [m for m in bench.tap.snapshot()[tap_mark:] if m.priority == 1]
    must_expire = [m for m in outage_data if m.at + DATA_TTL_S < up_at]
    alert_keys = {m.key for m in outage_alerts}
    # Every live message arrives (settle fails otherwise); a queue drains in order, so a wrongly sent
    # expired message would arrive before the newer live ones settle waits for.
    bench.settle()
    arrived = bench.cloud.snapshot()

    delivered_expired = sorted({m.key for m in arrived} & {m.key for m in must_expire})
    copies: dict[str, list[Seen]] = defaultdict(list)
    for message in arrived:
        copies[message.gw_message_id].append(message)
    outside_window = {gw_id: [c.gw_ms("gw-sent-ms") - detected_ms for c in found]
                      for gw_id, found in copies.items()
                      if len(found) > 1 and min(c.gw_ms("gw-sent-ms") for c in found) > detected_ms}
    sent_after_expiry = [m.key for m in arrived
                         if m.gw_ms("gw-sent-ms") > m.gw_ms("gw-enqueued-ms") + int(m.properties["gw-ttl-s"]) * 1000]
    duplicates = sum(len(found) - 1 for found in copies.values())
    # Sent in time but stalled in the broken connection: they reach the cloud after their TTL, legitimately.
    late = sum(1 for m in arrived if m.gw_ms("gw-enqueued-ms") + int(m.properties["gw-ttl-s"]) * 1000 < _wall_ms(m.at))
    print(f"outage: {len(outage_data)} telemetry messages entered the gateway, {len(must_expire)} expired before UP, "
          f"{len(delivered_expired)} of those delivered; {len(alert_keys)} alerts; {duplicates} duplicates; "
          f"{late} sent before their expiry but arrived after it")
    assert len(must_expire) >= EXPIRED_DURING_OUTAGE
    assert alert_keys <= {m.key for m in arrived}, "an alert of the outage was lost"
    assert not delivered_expired, f"messages delivered after their TTL passed: {delivered_expired}"
    assert not sent_after_expiry, f"the gateway sent messages after their expiry: {sent_after_expiry}"
    assert min(m.at for m in arrived if m.key in alert_keys) > up_at, "an alert crossed a link that was down"
    assert not outside_window, f"duplicates of messages first sent after the link broke: {outside_window}"
    assert not identity_problems(bench.tap.snapshot(), arrived)


def _wall_ms(monotonic_at: float) -> int:
    """A monotonic instant as Unix milliseconds, to compare with the gateway's ``gw-*-ms`` stamps."""
    return int((time.time() - (time.monotonic() - monotonic_at)) * 1000)
