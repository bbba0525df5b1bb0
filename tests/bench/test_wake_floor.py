"""The per-wake measurements of issue 30 (``bench/wake_floor.py``, ``bench/broker_core.py --cold``) run.

Not performance tests: the minimal relay must serve the light generator's paced load (every message
delivered and stamped, so its latencies are of the same messages as the brokers'), and the cold mode must
time every read of both kinds, cold and warm.
"""

from __future__ import annotations

import uvloop

from bench.broker_core import run_cold
from bench.broker_light import Load, measure
from bench.wake_floor import relay


def test_the_minimal_relay_delivers_and_acknowledges_the_paced_load() -> None:
    load = Load(1, publishers=1, messages=200, warmup=100, rate=2000.0)
    with relay() as target:
        result = uvloop.run(measure(target.host, target.port, target.process, load, "relay"))
    assert result.messages == load.messages
    assert len(result.latencies_ns) >= load.messages and min(result.latencies_ns) > 0


def test_the_cold_mode_times_every_read_warm_and_cold() -> None:
    times = uvloop.run(run_cold(10, 2))
    assert sorted(times) == ["puback cold", "puback warm", "publish cold", "publish warm"]
    assert all(len(values) == 5 and min(values) > 0 for values in times.values())
