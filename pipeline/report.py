"""The report: one HTML page with matplotlib plots and tables of the jobs' Parquet outputs.

It reads the outputs with pyarrow (no Spark: the outputs are small by construction), draws one PNG per
plot into ``<report dir>/img/`` and references them from ``<report dir>/index.html``, so the folder can be
copied or served as it is. Plots, each capped at ``max_plots``:

* delivery latency (p50 and p95) by priority over time, one plot per gateway; a window whose
  ``clock_suspect`` says the gateway's clock is off is drawn corrected by its ``clock_offset_ms`` and marked;
* backlog and link rate over a HIL run, one plot per run;
* temperature (average, min-max band) against the set point, one plot per thermostat.

Every plot draws the outputs' values at their times, and its axes span the data: a window's values hold
from its start to its end (a line segment per window, a gap where there is no window), the set point is
a step at each change time of ``setpoint_changes`` (not a window's last value at the window's start,
which drew a change at 11:42:20 at 11:40 and one at 11:38:17 not at all), and the time axis is the span
of the windows drawn (matplotlib's own limits for a single window ran from 2025 to 2029). The figures
are built by functions of their own (``thermostat_figure``, ``latency_figure``) so that a test can hold
their data arrays to the outputs.

Outputs that are missing or empty are left out of the page rather than failing it.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import matplotlib
import pandas as pd
import pyarrow.dataset as ds

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def read_output(out: Path | str, name: str) -> pd.DataFrame:
    path = Path(out, name)
    if not path.exists():
        return pd.DataFrame()
    frame = ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pandas()
    return frame.drop(columns=["date"], errors="ignore")


def _slug(*parts: object) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(str(part) for part in parts))


class _Page:
    def __init__(self, folder: Path):
        self.folder = folder
        (folder / "img").mkdir(parents=True, exist_ok=True)
        self.parts: list[str] = []
        self.images: list[str] = []

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def note(self, text: str) -> None:
        self.parts.append(f"<p>{html.escape(text)}</p>")

    def table(self, frame: pd.DataFrame) -> None:
        self.parts.append(frame.to_html(index=False, border=0, classes="data", na_rep="", float_format="{:.1f}".format))

    def figure(self, fig, name: str, caption: str) -> None:
        relative = f"img/{name}.png"
        fig.savefig(self.folder / relative, dpi=90, bbox_inches="tight")
        plt.close(fig)
        self.images.append(relative)
        self.parts.append(
            f'<figure><img src="{html.escape(relative)}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )

    def write(self, title: str) -> Path:
        page = self.folder / "index.html"
        style = (
            "body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
            "table.data{border-collapse:collapse;font-size:90%}"
            "table.data td,table.data th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
            "figure{display:inline-block;margin:0.5em}"
        )
        page.write_text(
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>\n" + "\n".join(self.parts)
            + "\n</body></html>\n",
            encoding="utf-8",
        )
        return page


def _ms(times: pd.Series) -> pd.Series:
    """Timestamps (naive or UTC) or Unix ms as Unix ms."""
    if pd.api.types.is_numeric_dtype(times):
        return times.astype("int64")
    stamps = pd.to_datetime(times, utc=True)
    return (stamps - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)


def _at(ms: list[int] | pd.Series) -> list:
    """Unix ms as the naive UTC datetimes matplotlib draws."""
    return list(pd.to_datetime(pd.Series(ms, dtype="int64"), unit="ms"))


def per_window(starts: pd.Series, ends: pd.Series, *values: pd.Series) -> tuple[list, ...]:
    """A value per window as a segment from its start to its end, NaN between windows (a gap, never a
    line across a missing window): (times in ms, values...) to draw."""
    times: list[int] = []
    columns: list[list[float]] = [[] for _ in values]
    for index, (start, end) in enumerate(zip(_ms(starts), _ms(ends), strict=True)):
        times += [int(start), int(end), int(end)]
        for column, series in zip(columns, values, strict=True):
            value = float(series.iloc[index])
            column += [value, value, float("nan")]
    return (times, *columns)


def setpoint_steps(changes: pd.Series, first_ms: int, last_ms: int) -> tuple[list[int], list[float]]:
    """The set point over [first_ms, last_ms] as a step function (drawn ``steps-post``) from the change log
    rows of one thermostat (``changed_ms``, ``previous_set_point``, ``set_point``): a point at each change
    time, the value before the first change from its ``previous_set_point``."""
    rows = changes.sort_values("changed_ms")
    before = rows[rows["changed_ms"] <= first_ms]
    inside = rows[(rows["changed_ms"] > first_ms) & (rows["changed_ms"] <= last_ms)]
    if len(before):
        start_value = float(before["set_point"].iloc[-1])
    elif len(inside) and pd.notna(inside["previous_set_point"].iloc[0]):
        start_value = float(inside["previous_set_point"].iloc[0])
    else:
        start_value = float("nan")  # the log starts inside the plot: nothing known before it
    times = [first_ms, *[int(t) for t in inside["changed_ms"]]]
    values = [start_value, *[float(v) for v in inside["set_point"]]]
    return [*times, last_ms], [*values, values[-1]]


def thermostat_figure(rollups: pd.DataFrame, changes: pd.DataFrame, title: str):
    """One thermostat's rollups and set-point changes: the temperature average per window, its min-max
    band, and the set point as steps at its change times; axes spanning the data."""
    rows = rollups.sort_values("window_start")
    first_ms, last_ms = int(_ms(rows["window_start"]).min()), int(_ms(rows["window_end"]).max())
    times, average, low, high = per_window(rows["window_start"], rows["window_end"], rows["temperature_avg"],
                                           rows["temperature_min"], rows["temperature_max"])
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.fill_between(_at(times), low, high, alpha=0.2, color="tab:orange", label="min-max", linewidth=0)
    ax.plot(_at(times), average, color="tab:orange", label="temperature")
    step_times, step_values = setpoint_steps(changes.assign(changed_ms=_ms(changes["changed_ms"])) if len(changes)
                                             else pd.DataFrame(columns=["changed_ms", "previous_set_point", "set_point"]),
                                             first_ms, last_ms)
    ax.plot(_at(step_times), step_values, drawstyle="steps-post", color="tab:green", label="set point")
    ax.set_xlim(_at([first_ms])[0], _at([last_ms])[0])
    shown = [v for v in [*low, *high, *step_values] if v == v]
    if shown:
        margin = max(0.5, (max(shown) - min(shown)) * 0.05)
        ax.set_ylim(min(shown) - margin, max(shown) + margin)
    ax.set_ylabel("°C")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.autofmt_xdate()
    return fig


def corrected(latency: pd.DataFrame) -> pd.DataFrame:
    """The latency windows with their percentiles corrected by the gateway's clock offset where
    ``clock_suspect`` (``delivery.py``): received - (enqueued on the gateway's clock + offset)."""
    if "clock_suspect" not in latency.columns:
        return latency.assign(clock_suspect=False)
    suspect = latency["clock_suspect"].fillna(False).astype(bool)
    shift = latency["clock_offset_ms"].where(suspect, 0).fillna(0)
    fixed = latency.copy()
    for name in ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms"):
        fixed[name] = latency[name] - shift
    fixed["clock_suspect"] = suspect
    return fixed


def latency_figure(latency: pd.DataFrame, gateway: str):
    """One gateway's latency windows (already ``corrected``): p95 and p50 per priority, a segment per
    window; windows corrected for the gateway's clock marked with crosses."""
    rows = latency[latency["gateway_id"] == gateway].sort_values("window_start")
    first_ms, last_ms = int(_ms(rows["window_start"]).min()), int(_ms(rows["window_end"]).max())
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for priority, group in rows.groupby("priority"):
        times, p95, p50 = per_window(group["window_start"], group["window_end"], group["latency_p95_ms"] / 1000,
                                     group["latency_p50_ms"] / 1000)
        line = ax.plot(_at(times), p95, label=f"priority {priority} p95")
        ax.plot(_at(times), p50, linestyle=":", color=line[0].get_color(), label=f"priority {priority} p50")
        fixed = group[group["clock_suspect"]]
        if len(fixed):
            ax.plot(_at(_ms(fixed["window_start"])), fixed["latency_p95_ms"] / 1000, "x", color=line[0].get_color(),
                    label=f"priority {priority}: corrected for the gateway's clock")
    ax.set_xlim(_at([first_ms])[0], _at([last_ms])[0])
    ax.set_ylabel("latency (s)")
    ax.set_title(f"{gateway}: delivery latency by priority")
    ax.legend(fontsize="small", ncol=2)
    fig.autofmt_xdate()
    return fig


def _progress(message: str) -> None:
    print(f"report: {message}", file=sys.stderr, flush=True)


def latency_section(page: _Page, out: Path, max_plots: int, upstream_endpoint: str) -> None:
    latency, counters = read_output(out, "delivery_latency"), read_output(out, "queue_counters")
    if latency.empty:
        return
    page.heading("Delivery SLA")
    latency = corrected(latency)
    summary = latency.groupby(["gateway_id", "priority"]).agg(
        delivered=("delivered", "sum"),
        worst_p95_ms=("latency_p95_ms", "max"),
        worst_p99_ms=("latency_p99_ms", "max"),
        max_ms=("latency_max_ms", "max"),
        clock_corrected_windows=("clock_suspect", "sum"),
    )
    if not counters.empty:
        upstream = counters[counters["endpoint"] == upstream_endpoint]
        summary = summary.join(upstream.groupby(["gateway_id", "priority"])[["expired", "dropped"]].sum(), how="outer")
    page.note("Per gateway and priority over the whole period: worst window percentiles, "
              "and expired/dropped counts from the gateway's metrics. clock_corrected_windows: windows in which "
              "the gateway's clock was off (receive - send below zero or over a minute); their latencies "
              "are corrected by the measured offset here and in the plots (the output keeps both).")
    page.table(summary.reset_index())
    offsets = latency[latency["clock_suspect"]].groupby("gateway_id")["clock_offset_ms"].agg(["min", "max"])
    if len(offsets):
        page.note("Gateways whose clock is off, as the cloud sees it (receive - send, lowest per window, ms): "
                  + "; ".join(f"{gateway}: {int(row['min'])} .. {int(row['max'])}" for gateway, row in offsets.iterrows()))
    gateways = sorted(latency["gateway_id"].dropna().unique())[:max_plots]
    for number, gateway in enumerate(gateways, start=1):
        _progress(f"latency plot {number}/{len(gateways)}")
        page.figure(latency_figure(latency, gateway), _slug("latency", gateway),
                    f"{gateway}: p50 (dotted) and p95 latency per priority, a segment per window")


def hil_section(page: _Page, out: Path, max_plots: int) -> None:
    summary, timeline = read_output(out, "hil_summary"), read_output(out, "hil_timeline")
    if summary.empty and timeline.empty:
        return
    page.heading("HIL runs")
    if not summary.empty:
        page.table(summary.sort_values(["run_id", "priority"]))
    runs = timeline[["run_id", "scenario"]].drop_duplicates().sort_values("run_id").head(max_plots).itertuples()
    runs = list(runs)
    for number, run in enumerate(runs, start=1):
        _progress(f"HIL plot {number}/{len(runs)}")
        rows = timeline[(timeline["run_id"] == run.run_id) & (timeline["scenario"] == run.scenario)]
        rows = rows.sort_values("second_ms")
        seconds = (rows["second_ms"] - rows["second_ms"].min()) / 1000
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.step(seconds, rows["backlog"], where="post", color="tab:red", label="backlog (messages)")
        ax.set_xlabel("seconds into the run")
        ax.set_ylabel("backlog (messages)", color="tab:red")
        rate = ax.twinx()
        shaped = rows["rate_bps"].where(rows["rate_bps"] > 0)  # 0: the rig does not shape the link
        rate.step(seconds, shaped / 1000, where="post", color="tab:blue", label="link rate")
        rate.set_ylabel("link rate (kbit/s)", color="tab:blue")
        starts = seconds.tolist()
        for start, end, link in zip(starts, starts[1:] + [starts[-1] + 1], rows["link"], strict=True):
            if link == "down":
                ax.axvspan(start, end, color="grey", alpha=0.2, linewidth=0)
        ax.set_ylim(bottom=0)
        rate.set_ylim(bottom=0)
        ax.set_title(f"{run.run_id} ({run.scenario}): backlog and link rate")
        page.figure(fig, _slug("hil", run.run_id, run.scenario),
                    f"{run.run_id} ({run.scenario}): grey while the link is down; no rate line while unshaped")


def thermostat_section(page: _Page, out: Path, max_plots: int) -> None:
    rollups, changes = read_output(out, "rollups"), read_output(out, "setpoint_changes")
    if rollups.empty:
        return
    page.heading("Thermostats")
    devices = rollups[["gateway_id", "device_id"]].drop_duplicates().sort_values(["gateway_id", "device_id"])
    devices = list(devices.head(max_plots).itertuples())
    for number, device in enumerate(devices, start=1):
        _progress(f"thermostat plot {number}/{len(devices)}")
        rows = rollups[(rollups["gateway_id"] == device.gateway_id) & (rollups["device_id"] == device.device_id)]
        own = changes[(changes["gateway_id"] == device.gateway_id) & (changes["device_id"] == device.device_id)] \
            if not changes.empty else changes
        fig = thermostat_figure(rows, own, f"{device.gateway_id}/{device.device_id}: temperature vs set point")
        page.figure(fig, _slug("thermostat", device.gateway_id, device.device_id),
                    f"{device.gateway_id}/{device.device_id}: set point from its change log, at its change times")


def version_order(version: str) -> list[tuple[int, int, str]]:
    """A sort key for the firmware's own version strings (any text, ``build.py --version``): numbers as
    numbers, words as words, a number before a word at the same place, so no two parts are ever compared
    across types (``0.2.0-rc1`` against ``0.2.0.1`` raised a TypeError)."""
    return [(0, int(part), "") if part.isdecimal() else (1, 0, part) for part in re.split(r"[.-]", version)]


def firmware_figure(log: pd.DataFrame, max_lines: int):
    """The running version of each thermostat over time (steps at the statuses that changed it; versions
    in version order on the y axis)."""
    running = log[log["running"].notna()].copy()
    running["at_ms"] = _ms(running["at_ms"])
    versions = sorted(running["running"].unique(), key=version_order)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    devices = running[["gateway_id", "device_id"]].drop_duplicates().sort_values(["gateway_id", "device_id"])
    first_ms, last_ms = int(running["at_ms"].min()), int(running["at_ms"].max())
    for device in list(devices.itertuples())[:max_lines]:
        rows = running[(running["gateway_id"] == device.gateway_id) & (running["device_id"] == device.device_id)]
        rows = rows.sort_values("at_ms")
        changed = rows[rows["running"] != rows["running"].shift()]
        times = [*changed["at_ms"], last_ms]
        values = [versions.index(v) for v in changed["running"]]
        ax.plot(_at(times), [*values, values[-1]], drawstyle="steps-post", label=f"{device.gateway_id}/{device.device_id}")
    ax.set_yticks(range(len(versions)), versions)
    ax.set_xlim(_at([first_ms])[0], _at([max(last_ms, first_ms + 1)])[0])
    ax.set_title("firmware version per thermostat")
    ax.legend(fontsize="small", ncol=2)
    fig.autofmt_xdate()
    return fig


def firmware_section(page: _Page, out: Path, max_plots: int) -> None:
    log, updates = read_output(out, "firmware"), read_output(out, "firmware_updates")
    if log.empty and updates.empty:
        return
    page.heading("Firmware")
    if not log.empty and log["running"].notna().any():
        latest = log[log["running"].notna()].sort_values("at_ms").groupby(["gateway_id", "device_id"]).tail(1)
        page.note("Versions running now (latest status of each thermostat):")
        page.table(latest.groupby("running").size().rename("thermostats").reset_index())
        page.figure(firmware_figure(log, max_plots), "firmware-versions", "running version per thermostat over time")
    if not updates.empty:
        page.note("Over-the-air updates: per thermostat and target version, from its first status naming the "
                  "version to the first one running it (installed), or its first terminal record (rolled_back, "
                  "refused, waiting) with the reason; times in the gateway's clock.")
        shown = updates.assign(duration_s=updates["duration_ms"] / 1000).sort_values(["started_ms", "device_id"])
        page.table(shown[["gateway_id", "device_id", "from_version", "version", "started_at", "duration_s", "outcome",
                          "reason"]])


def quarantine_section(page: _Page, out: Path) -> None:
    quarantine = read_output(out, "quarantine")
    if quarantine.empty:
        return
    page.heading("Quarantine")
    counts = quarantine.groupby(["stage", "reason"]).size().rename("messages").reset_index()
    page.table(counts.sort_values("messages", ascending=False))


def render_report(out: Path | str, report_dir: Path | str, max_plots: int = 12,
                  title: str = "Gateway telemetry pipeline", upstream_endpoint: str = "upstream") -> Path:
    """Write ``report_dir/index.html`` and its images; returns the page's path."""
    out, page = Path(out), _Page(Path(report_dir))
    latency_section(page, out, max_plots, upstream_endpoint)
    hil_section(page, out, max_plots)
    thermostat_section(page, out, max_plots)
    firmware_section(page, out, max_plots)
    quarantine_section(page, out)
    if not page.parts:
        page.note(f"No outputs under {out}.")
    return page.write(title)
