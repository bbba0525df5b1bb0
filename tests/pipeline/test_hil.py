"""HIL run analysis over the sample timeline (pipeline_data.hil_timeline)."""

import pytest

pytestmark = pytest.mark.slow  # Spark jobs over the sample: seconds each


def test_summary_per_priority(spark, batch_outputs):
    settings, _ = batch_outputs
    rows = {r.priority: r for r in spark.read.parquet(settings.output("hil_summary")).collect()}
    high, low = rows[0], rows[5]
    assert (high.sent, high.delivered, high.duplicates, high.expired, high.lost) == (2, 2, 1, 0, 0)
    assert (high.latency_p50_ms, high.latency_max_ms) == (200, 2500)
    assert (low.sent, low.delivered, low.duplicates, low.expired, low.lost) == (3, 1, 0, 1, 1)
    assert low.latency_p99_ms == 4000 and low.expired_but_delivered == 0
    assert set(rows) == {0, 5}  # rig events are not messages


def test_timeline_backlog_and_link_carried_forward(spark, batch_outputs):
    settings, _ = batch_outputs
    frame = spark.read.parquet(settings.output("hil_timeline")).orderBy("second_ms").toPandas()
    assert (frame["second_ms"] // 1000).tolist() == [0, 1, 2, 3, 5]
    assert frame["sent"].tolist() == [2, 3, 0, 0, 0]
    assert frame["delivered"].tolist() == [1, 0, 0, 1, 1]
    assert frame["expired"].tolist() == [0, 0, 1, 0, 0]
    assert frame["backlog"].tolist() == [1, 4, 3, 2, 1]
    assert frame["link"].tolist() == ["up", "down", "down", "up", "up"]
    assert frame["rate_bps"].tolist() == [64000, 64000, 64000, 32000, 16000]
    assert frame["delay_ms"].tolist() == [50, 50, 50, 50, 300]
    assert frame["loss_pct"].tolist() == [0, 0, 0, 1, 1]  # the refused LOSS 100 changed nothing
