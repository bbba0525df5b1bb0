"""What the report's plots draw is the outputs' values at their times: a test reads the figures' data
arrays back (matplotlib lines and limits) and holds them to the output rows."""

import math
from datetime import datetime, timedelta

import pytest

# The standard library's times, which pandas takes as its own: pandas and matplotlib are imported by the tests
# that draw, not at collection (every test worker collects this folder).
T = datetime(2026, 1, 1, 11, 30)
MIN = timedelta(minutes=1)


def ms(value) -> int:
    import pandas as pd

    return int((pd.Timestamp(value) - pd.Timestamp(0)) // pd.Timedelta(milliseconds=1))


def drawn(ax, label):
    import matplotlib.dates as mdates
    import pandas as pd

    (line,) = [line for line in ax.get_lines() if line.get_label() == label]
    times = [ms(mdates.num2date(x).replace(tzinfo=None)) if not isinstance(x, pd.Timestamp) else ms(x)
             for x in line.get_xdata()]
    return list(zip(times, line.get_ydata(), strict=True))


def axis_ms(ax) -> tuple[int, int]:
    import matplotlib.dates as mdates

    low, high = ax.get_xlim()
    return tuple(ms(mdates.num2date(v).replace(tzinfo=None)) for v in (low, high))


def rollup(start, avg, low, high, last):
    return {"gateway_id": "gw1", "device_id": "t1", "window_start": start, "window_end": start + 5 * MIN,
            "temperature_avg": avg, "temperature_min": low, "temperature_max": high, "set_point_last": last}


def change(at, previous, value):
    return {"gateway_id": "gw1", "device_id": "t1", "changed_ms": ms(at), "previous_set_point": previous,
            "set_point": value}


def test_set_points_are_steps_at_their_change_times_and_windows_hold_their_values():
    import pandas as pd

    from pipeline.report import thermostat_figure

    rollups = pd.DataFrame([rollup(T + 5 * MIN, 20.0, 19.5, 20.5, 21.0), rollup(T + 10 * MIN, 20.5, 20.0, 21.0, 22.0)])
    changes = pd.DataFrame([change(T + 8 * MIN + pd.Timedelta(seconds=17), 20.0, 21.0),   # 11:38:17
                            change(T + 12 * MIN + pd.Timedelta(seconds=20), 21.0, 22.0)])  # 11:42:20
    ax = thermostat_figure(rollups, changes, "t1").axes[0]
    start, end = ms(T + 5 * MIN), ms(T + 15 * MIN)
    assert drawn(ax, "set point") == [(start, 20.0), (ms(T + 8 * MIN) + 17_000, 21.0),
                                      (ms(T + 12 * MIN) + 20_000, 22.0), (end, 22.0)]
    temperature = [(t, v) for t, v in drawn(ax, "temperature") if not math.isnan(v)]
    assert temperature == [(start, 20.0), (ms(T + 10 * MIN), 20.0), (ms(T + 10 * MIN), 20.5), (end, 20.5)]
    assert axis_ms(ax) == (start, end)
    low, high = ax.get_ylim()
    assert 18.5 <= low < 19.5 and 22.0 < high <= 23.0  # scaled to the data


def test_a_single_window_gets_an_axis_of_that_window():
    """Before: one window gave an x-axis from 2025-01 to 2029-01, the data invisible."""
    import pandas as pd

    from pipeline.report import thermostat_figure

    rollups = pd.DataFrame([rollup(T, 20.0, 20.0, 20.0, 21.0)])
    ax = thermostat_figure(rollups, pd.DataFrame([change(T + MIN, None, 21.0)]), "t1").axes[0]
    assert axis_ms(ax) == (ms(T), ms(T + 5 * MIN))
    assert [v for _, v in drawn(ax, "set point")][1:] == [21.0, 21.0]


def test_latency_of_a_gateway_whose_clock_is_ahead_is_drawn_corrected():
    import pandas as pd

    from pipeline.report import corrected, latency_figure

    latency = pd.DataFrame([{"gateway_id": "gw1", "priority": 5, "window_start": T, "window_end": T + 5 * MIN,
                             "delivered": 3, "latency_p50_ms": -599_000, "latency_p95_ms": -598_000,
                             "latency_p99_ms": -598_000, "latency_max_ms": -598_000, "clock_offset_ms": -599_500,
                             "clock_suspect": True}])
    ax = latency_figure(corrected(latency), "gw1").axes[0]
    p50 = [v for _, v in drawn(ax, "priority 5 p50") if not math.isnan(v)]
    assert p50 == [0.5, 0.5]  # -599 s + 599.5 s


@pytest.mark.slow  # the batch outputs over the sample
def test_the_thermostat_plots_draw_the_batch_outputs(batch_outputs):
    from pipeline.report import read_output, thermostat_figure

    settings, _ = batch_outputs
    rollups, changes = read_output(settings.out, "rollups"), read_output(settings.out, "setpoint_changes")
    for (gateway, device), rows in rollups.groupby(["gateway_id", "device_id"]):
        own = changes[(changes["gateway_id"] == gateway) & (changes["device_id"] == device)]
        ax = thermostat_figure(rows, own, device).axes[0]
        start = ms(rows["window_start"].min().tz_localize(None) if rows["window_start"].dt.tz else rows["window_start"].min())
        steps = drawn(ax, "set point")
        inside = own[(own["changed_ms"] > start)]
        assert [t for t, _ in steps[1:-1]] == sorted(inside["changed_ms"].tolist())
        assert [v for _, v in steps[1:-1]] == inside.sort_values("changed_ms")["set_point"].tolist()
        averages = [v for _, v in drawn(ax, "temperature")[::3]]
        assert averages == rows.sort_values("window_start")["temperature_avg"].tolist()
