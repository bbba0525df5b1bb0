"""The pipeline checked from outside on a fleet with everything at once (``fleet_truth.py``): a backlog
spread over three ingest writers, one of which crashes with its part in an open file; gateway clocks
ahead, behind, stepped back and forward; a thermostat silent mid-update; updates installed and rolled
back; redeliveries across writers and windows; a gateway restart; a landing line cut short.

Every output row of batch equals the truth computed in plain Python from the messages sent; the report
draws the outputs' values at their times; and (``slow``) streaming, run between landings in an order an
ingest could produce, writes only rows equal to batch's, and every window it should by then."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest

from tests.pipeline import fleet_truth as truth
from tests.pipeline.fleet_truth import DRAIN_START, MINUTE, T0

if TYPE_CHECKING:  # imported where used: every `make test` worker collects this folder and runs no Spark
    import pandas as pd

END = T0 + 200 * MINUTE


def read(out, name: str) -> pd.DataFrame:
    """An output as a reader sees it (pyarrow, as the report does)."""
    import pandas as pd
    import pyarrow.dataset as ds

    frame = ds.dataset(f"{out}/{name}", format="parquet", partitioning="hive").to_table().to_pandas()
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            frame[column] = (frame[column].dt.tz_localize(None) - pd.Timestamp(0)) // pd.Timedelta(milliseconds=1)
    return frame


def same(value, expected) -> bool:
    import pandas as pd

    if expected is None:
        return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA
    if isinstance(expected, float):
        return math.isclose(float(value), expected, rel_tol=1e-12, abs_tol=1e-12)
    return value == expected


def compare(rows: pd.DataFrame, keys: list[str], expected: dict[tuple, dict], *, complete: bool = True) -> list[str]:
    """Every output row equals its truth, and (``complete``) every truth row is there: the differences."""
    problems = []
    seen = set()
    for row in rows.to_dict("records"):
        key = tuple(row[k] for k in keys)
        seen.add(key)
        if key not in expected:
            problems.append(f"{key}: not in the truth: {row}")
            continue
        for column, want in expected[key].items():
            if not same(row[column], want):
                problems.append(f"{key}: {column} = {row[column]!r}, truth {want!r}")
    if complete:
        problems += [f"{key}: missing (truth {value})" for key, value in expected.items() if key not in seen]
    return problems


def land_everything(landing, fleet) -> None:
    """The whole fleet landed as the writers would: c crashes with its part of the drain in an open file
    and seals it when it starts again, two hours later."""
    truth.land_range(landing, fleet, T0, DRAIN_START + 5 * MINUTE, crash="ingest-c")
    truth.land_corrupt_file(landing)
    truth.land_range(landing, fleet, DRAIN_START + 5 * MINUTE, END, only="ingest-a")
    truth.land_range(landing, fleet, DRAIN_START + 5 * MINUTE, END, only="ingest-b")
    with truth.ingest_clock(DRAIN_START + 120 * MINUTE):
        from pipeline.landing import LandingWriter

        assert LandingWriter(landing, "ingest-c").recovered


@pytest.fixture(scope="module")
def fleet():
    return truth.build_fleet()


@pytest.fixture(scope="module")
def fleet_batch(spark, fleet, tmp_path_factory):
    from pipeline.jobs.batch import run_batch
    from pipeline.jobs.settings import JobSettings

    root = tmp_path_factory.mktemp("fleet")
    land_everything(root / "landing", fleet)
    settings = JobSettings(str(root / "landing"), str(root / "out"))
    run_batch(spark, settings, progress=lambda _: None)
    return settings


def test_the_fleet_has_what_the_scenario_promises(fleet):
    """The generator itself: its conditions are in the data (else the checks below prove less)."""
    drained = [s for s in fleet.sent if s.meta.get("drained")]
    assert {s.writer for s in drained} == set(truth.WRITERS) and len(drained) == 60
    d_ts = [s.reading["ts"] for s in sorted(drained, key=lambda s: s.message.received_ms) if s.reading]
    assert any(b < a for a, b in zip(d_ts, d_ts[1:], strict=False))  # the step back, inside the backlog
    suspect = {gw for (gw, _, _), row in truth.delivery_latency(fleet).items() if row["clock_suspect"]}
    assert suspect == {"gwB", "gwC", "gwD"}
    outcomes = {(d, v): row["outcome"] for (_, d, v), row in truth.firmware_updates(fleet).items()}
    assert outcomes == {("a2", "0.3.0"): "in_progress", ("b1", "0.2.0"): "rolled_back", ("c1", "0.2.0"): "installed"}


@pytest.mark.parametrize("name, keys, computed", [
    ("rollups", ["gateway_id", "device_id", "window_start"], truth.rollups),
    ("setpoint_changes", ["gateway_id", "device_id", "changed_ms"], truth.setpoint_changes),
    ("delivery_latency", ["gateway_id", "priority", "window_start"], truth.delivery_latency),
    ("queue_counters", ["gateway_id", "endpoint", "priority", "window_start"], truth.queue_counters),
    ("firmware_updates", ["gateway_id", "device_id", "version"], truth.firmware_updates),
])
def test_every_batch_row_equals_the_truth(fleet_batch, fleet, name, keys, computed):
    problems = compare(read(fleet_batch.out, name), keys, computed(fleet))
    assert not problems, "\n".join(problems[:20])


def test_batch_quarantine_holds_each_rejected_message_once(fleet_batch, fleet):
    found = read(fleet_batch.out, "quarantine").groupby(["stage", "reason"]).size().to_dict()
    assert found == truth.quarantine(fleet)


# -- the report ----------------------------------------------------------------------------------------------

def test_the_report_draws_the_fleets_outputs_at_their_times(fleet_batch, tmp_path):
    """For every thermostat and gateway of the fleet: each window's temperature average is a segment over
    exactly that window, the set point steps at each change time of ``setpoint_changes`` (seconds into a
    window) to its value; latency is drawn per window, corrected by the offset where the clock is off."""
    from pipeline.report import corrected, render_report

    page = render_report(fleet_batch.out, tmp_path / "report").read_text()
    assert "Firmware" in page and "no telemetry after its trial boot" in page and "in_progress" in page
    assert_plots_draw(fleet_batch.out)
    latency = corrected(read(fleet_batch.out, "delivery_latency"))
    # a gateway whose clock is off is drawn corrected: no negative latency, none of minutes on a 2 s link
    assert latency[latency["gateway_id"].isin(["gwB", "gwC"])]["latency_max_ms"].abs().max() < 60_000


def assert_plots_draw(out) -> None:
    """The thermostat and latency figures of the outputs under ``out`` (batch's or streaming's) draw their
    rows' values over their windows, the set point at its change times."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from pipeline.report import corrected, latency_figure, thermostat_figure
    from tests.pipeline.test_report_plots import drawn

    rollups, changes = read(out, "rollups"), read(out, "setpoint_changes")
    for (gateway, device), rows in rollups.groupby(["gateway_id", "device_id"]):
        rows = rows.sort_values("window_start")
        own = changes[(changes["gateway_id"] == gateway) & (changes["device_id"] == device)]
        stamps = rows.assign(window_start=pd.to_datetime(rows["window_start"], unit="ms"),
                             window_end=pd.to_datetime(rows["window_end"], unit="ms"))
        ax = thermostat_figure(stamps, own, device).axes[0]
        segments = [(t, v) for t, v in drawn(ax, "temperature") if not math.isnan(v)]
        want = [point for row in rows.itertuples() for point in
                ((row.window_start, row.temperature_avg), (row.window_end, row.temperature_avg))]
        assert segments == want, (gateway, device)
        steps = drawn(ax, "set point")
        first, last = int(rows["window_start"].min()), int(rows["window_end"].max())
        inside = own[(own["changed_ms"] > first) & (own["changed_ms"] <= last)].sort_values("changed_ms")
        assert steps[1:-1] == list(zip(inside["changed_ms"], inside["set_point"], strict=True)), (gateway, device)
        assert steps[0][0] == first and steps[-1][0] == last
        plt.close("all")
    latency = corrected(read(out, "delivery_latency"))
    for gateway, rows in latency.groupby("gateway_id"):
        stamps = rows.assign(window_start=pd.to_datetime(rows["window_start"], unit="ms"),
                             window_end=pd.to_datetime(rows["window_end"], unit="ms"))
        ax = latency_figure(stamps, gateway).axes[0]
        for priority, group in rows.groupby("priority"):
            group = group.sort_values("window_start")
            p50 = [(t, v) for t, v in drawn(ax, f"priority {priority} p50") if not math.isnan(v)]
            want = [point for row in group.itertuples() for point in
                    ((row.window_start, row.latency_p50_ms / 1000), (row.window_end, row.latency_p50_ms / 1000))]
            assert p50 == want, (gateway, priority)
        plt.close("all")


# -- streaming -----------------------------------------------------------------------------------------------

def streamed(out, name: str) -> pd.DataFrame:
    import pandas as pd

    try:
        return read(out, name)
    except FileNotFoundError:
        return pd.DataFrame()


class Streaming:
    """``stream --once`` runs over a landing zone, each run's rows held to the truth."""

    def __init__(self, spark, fleet, tmp_path, options=None):
        from pipeline.jobs.settings import JobSettings
        from pipeline.jobs.source import StreamOptions

        self.spark, self.fleet = spark, fleet
        self.landing, self.checkpoint = tmp_path / "landing", str(tmp_path / "checkpoint")
        self.settings = JobSettings(str(self.landing), str(tmp_path / "out"))
        self.options = options or StreamOptions()
        self.expected = {name: (keys, computed(fleet)) for name, keys, computed in OUTPUT_TRUTH
                         if name != "firmware_updates"}  # batch only

    def run(self) -> dict[str, pd.DataFrame]:
        from pipeline.jobs import stream

        stream.run_stream(self.spark, self.settings, self.checkpoint, self.options, once=True, progress=lambda _: None)
        outputs = {name: streamed(self.settings.out, name) for name in self.expected}
        for name, (keys, rows) in self.expected.items():
            if len(outputs[name]):
                problems = compare(outputs[name], keys, rows, complete=False)
                assert not problems, f"{name}:\n" + "\n".join(problems[:20])
        return outputs

    def check_complete(self, outputs: dict[str, pd.DataFrame], closed_by_ms: int) -> None:
        """Every window that ends by ``closed_by_ms`` is written (its key's data went far enough past it),
        the silent thermostat's too; the quarantine holds each rejected message once."""
        for name, (keys, rows) in self.expected.items():
            if name == "setpoint_changes":
                continue
            frame = outputs[name]
            written = set(zip(*[frame[k] for k in keys], strict=True))
            due = {key for key in rows if key[-1] + truth.WINDOW_MS <= closed_by_ms}
            assert not due - written, f"{name}: {sorted(due - written)[:10]}"
        rollups = outputs["rollups"]
        silent = set(zip(rollups["gateway_id"], rollups["device_id"], rollups["window_start"], strict=True))
        assert {k for k in silent if k[1] == "a2"} == {k for k in self.expected["rollups"][1] if k[1] == "a2"}
        quarantine = streamed(self.settings.out, "quarantine").groupby(["stage", "reason"]).size().to_dict()
        assert quarantine == truth.quarantine(self.fleet)


@pytest.mark.slow  # three streaming runs
def test_streaming_between_landings_writes_only_true_rows_and_every_closed_window(spark, fleet, tmp_path):
    """``stream --once`` runs while writer c's part of the drain is still in an open file (crashed), then
    after writer a's next files but before b's, then after b's, c's restart and the rest. Every row
    streaming writes, each run, equals the truth (which batch equals, above); after the last, every window
    closed by then is there - the silent thermostat's last ones too."""
    from pipeline.landing import LandingWriter

    run = Streaming(spark, fleet, tmp_path)
    drain_end = DRAIN_START + 5 * MINUTE
    truth.land_range(run.landing, fleet, T0, drain_end, crash="ingest-c")
    truth.land_corrupt_file(run.landing)
    first = run.run()
    assert first["rollups"].empty or first["rollups"]["window_end"].max() <= DRAIN_START  # c's open file holds it
    truth.land_range(run.landing, fleet, drain_end, T0 + 150 * MINUTE, only="ingest-a")
    run.run()
    truth.land_range(run.landing, fleet, drain_end, T0 + 150 * MINUTE, only="ingest-b")
    with truth.ingest_clock(T0 + 150 * MINUTE):
        assert LandingWriter(run.landing, "ingest-c").recovered
    truth.land_range(run.landing, fleet, T0 + 150 * MINUTE, END)
    run.check_complete(run.run(), T0 + 150 * MINUTE)
    from pipeline.report import render_report

    assert "Thermostats" in render_report(run.settings.out, tmp_path / "report").read_text()
    assert_plots_draw(run.settings.out)  # the report over streaming's outputs


# -- a ranged run after late data ----------------------------------------------------------------------------

DAY = 24 * 60 * MINUTE


def with_later_days(fleet: truth.Fleet) -> tuple[truth.Fleet, list]:
    """The fleet, a second day of a1's readings, and two readings of day 1 that arrive late: one on
    day 2 (within --late-days 1 of a run over day 2) and one on day 4 (beyond what that run reads)."""
    later = truth.Fleet()
    later.sent = list(fleet.sent)
    later._seq = dict(fleet._seq)
    later._writer_turn = fleet._writer_turn
    for minute in range(0, 24 * 60, 30):
        later.reading(truth.GW_A, "a1", T0 + DAY + minute * MINUTE + 20_000, 20.0 + minute % 7, 23.0, True)
    late = []
    for received in (T0 + DAY + 3 * 60 * MINUTE, T0 + 3 * DAY + 60 * MINUTE):
        item = later.reading(truth.GW_A, "a3", T0 + 10 * MINUTE, 25.0, 24.0, True)  # a thermostat of its own
        message = item.message
        item.message = type(message)(message.topic, message.payload, received, message.user_properties,
                                     message.content_type)
        item.meta["received"] = received
        late.append(item)
    return later, late


def seen_by(fleet: truth.Fleet, last_received_ms: int) -> truth.Fleet:
    seen = truth.Fleet()
    seen.sent = [s for s in fleet.sent if s.message.received_ms < last_received_ms]
    return seen


@pytest.mark.slow  # two batch runs
def test_a_ranged_run_after_late_data_rewrites_its_dates_as_the_truth_of_what_it_reads(spark, fleet, tmp_path):
    """Full run, then ``--from 2026-01-02`` (late-days 1: reads 2025-12-31..2026-01-03, rewrites
    2026-01-01..01-02): its partitions hold the truth of the messages received by 01-03's end, every row,
    the reading received on 01-04 left out and named in its progress lines; the other partitions are the
    full run's."""
    from pipeline.jobs.batch import run_batch
    from pipeline.jobs.settings import JobSettings

    later, (_, beyond) = with_later_days(fleet)
    landing = tmp_path / "landing"
    land_everything(landing, later)
    truth.land_range(landing, later, END, T0 + 4 * DAY)
    full = JobSettings(str(landing), str(tmp_path / "out"))
    run_batch(spark, full, progress=lambda _: None)
    for name, keys, computed in OUTPUT_TRUTH:
        problems = compare(read(full.out, name), keys, computed(later))
        assert not problems, f"full {name}:\n" + "\n".join(problems[:20])
    said = []
    ranged = JobSettings(str(landing), str(tmp_path / "out"), received_from="2026-01-02")
    run_batch(spark, ranged, progress=said.append)
    assert any("late data not seen: 1 readings and 0 metrics samples received 2026-01-04..2026-01-04" in line
               for line in said), "\n".join(line for line in said if "[range]" in line)
    visible = seen_by(later, T0 + 3 * DAY)
    assert beyond not in visible.sent
    for name, keys, computed in OUTPUT_TRUTH:
        rows = read(ranged.out, name)
        date_of = rows["date"].astype(str)
        rewritten = rows[date_of.between("2026-01-01", "2026-01-02")]
        want = {key: row for key, row in computed(visible).items()
                if "2026-01-01" <= _date_of(name, key, row) <= "2026-01-02"}
        problems = compare(rewritten, keys, want)
        assert not problems, f"ranged {name}:\n" + "\n".join(problems[:20])


def _date_of(name: str, key: tuple, row: dict) -> str:
    """The output partition (UTC date) a truth row goes to."""
    import pandas as pd

    ms = row["started_ms"] if name == "firmware_updates" else key[-1]
    return pd.Timestamp(ms, unit="ms").strftime("%Y-%m-%d")


OUTPUT_TRUTH = [
    ("rollups", ["gateway_id", "device_id", "window_start"], truth.rollups),
    ("setpoint_changes", ["gateway_id", "device_id", "changed_ms"], truth.setpoint_changes),
    ("delivery_latency", ["gateway_id", "priority", "window_start"], truth.delivery_latency),
    ("queue_counters", ["gateway_id", "endpoint", "priority", "window_start"], truth.queue_counters),
    ("firmware_updates", ["gateway_id", "device_id", "version"], truth.firmware_updates),
]


@pytest.mark.slow  # three streaming runs
def test_streaming_paced_with_a_whole_writer_sealed_late_writes_only_true_rows(spark, fleet, tmp_path):
    """Another order, paced (``--max-files-per-trigger 2``): writer a crashes at once and its files (its
    half of everything before the drain, and of the drain) stay open while b's land and the stream runs;
    then a restarts, c's part of the drain lands, the stream runs; then the rest."""
    from pipeline.jobs.source import StreamOptions
    from pipeline.landing import LandingWriter

    run = Streaming(spark, fleet, tmp_path, StreamOptions(max_files_per_trigger=2))
    drain_end = DRAIN_START + 5 * MINUTE
    truth.land_range(run.landing, fleet, T0, drain_end, crash="ingest-a", only="ingest-a")
    truth.land_range(run.landing, fleet, T0, drain_end, only="ingest-b")
    truth.land_corrupt_file(run.landing)
    first = run.run()
    assert all(frame.empty for frame in first.values())  # a's open files hold every key back
    with truth.ingest_clock(drain_end):
        assert LandingWriter(run.landing, "ingest-a").recovered
    truth.land_range(run.landing, fleet, T0, drain_end, only="ingest-c")
    run.run()
    truth.land_range(run.landing, fleet, drain_end, END)
    run.check_complete(run.run(), T0 + 150 * MINUTE)


def test_the_duckdb_reference_agrees_with_the_truth(fleet_batch, fleet):
    """The other independent computation the tests use (DuckDB SQL over the landing lines) counts the same
    deliveries, update status messages included, and the same rollups."""
    from tests.pipeline import duckdb_reference

    con = duckdb_reference.connect(fleet_batch.landing)
    delivered = duckdb_reference.delivered(con)
    want = truth.delivery_latency(fleet)
    got = {(r.gateway_id, r.priority, r.window_start_ms): (r.delivered, r.latency_max_ms)
           for r in delivered.itertuples()}
    assert got == {key: (row["delivered"], row["latency_max_ms"]) for key, row in want.items()}
    rollups = duckdb_reference.rollups(con)
    assert len(rollups) == len(truth.rollups(fleet))
