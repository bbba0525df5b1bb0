"""The per-wake measurements of issue 30 (``bench/wake_floor.py``, ``bench/broker_core.py --cold``) run.

Not performance tests: the minimal relay must serve the light generator's paced load (every message
delivered and stamped, so its latencies are of the same messages as the brokers'), and the cold mode must
time every read of both kinds, cold and warm.
"""

from __future__ import annotations

import uvloop

from bench.broker_core import run_cold
from bench.broker_light import Load, measure
from bench.wake_floor import pooled_summary, ratio_interval, relay


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


def test_the_pooled_ratio_interval_resamples_whole_rounds() -> None:
    # Two rounds each: ours is slower in round 0 only, by a factor of 2 at every latency. Resampling
    # rounds must put draws on both sides of the mixed estimate, and identical inputs must give 1.
    fast = list(range(1_000, 2_000))
    slow = [latency * 2 for latency in fast]
    low, middle, high = ratio_interval([slow, fast], [fast, fast], 0.99)
    assert low == 1.0 and high == 2.0 and 1.0 <= middle <= 2.0
    assert ratio_interval([fast, slow], [fast, slow], 0.99) == (1.0, 1.0, 1.0)


def test_the_pooled_summary_names_every_target_and_the_ratio() -> None:
    rounds = {"ours": [[100_000, 200_000]], "mosquitto": [[100_000, 100_000]], "relay": [[50_000, 60_000]]}
    text = pooled_summary(rounds)
    assert "| p99 | 0.200 | 0.100 | 0.060 |" in text
    assert "p99 ours / mosquitto: 2.000" in text and "p99 relay / mosquitto: 0.600" in text
