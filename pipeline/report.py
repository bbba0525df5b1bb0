"""The report: one HTML page with matplotlib plots and tables of the jobs' Parquet outputs.

It reads the outputs with pyarrow (no Spark: the outputs are small by construction), draws one PNG per
plot into ``<report dir>/img/`` and references them from ``<report dir>/index.html``, so the folder can be
copied or served as it is. Plots, each capped at ``max_plots``:

* delivery latency (p50 and p95) by priority over time, one plot per gateway;
* backlog and link rate over a HIL run, one plot per run;
* temperature (average, min-max band) against the set point, one plot per thermostat.

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


def _progress(message: str) -> None:
    print(f"report: {message}", file=sys.stderr, flush=True)


def latency_section(page: _Page, out: Path, max_plots: int, upstream_endpoint: str) -> None:
    latency, counters = read_output(out, "delivery_latency"), read_output(out, "queue_counters")
    if latency.empty:
        return
    page.heading("Delivery SLA")
    summary = latency.groupby(["gateway_id", "priority"]).agg(
        delivered=("delivered", "sum"),
        worst_p95_ms=("latency_p95_ms", "max"),
        worst_p99_ms=("latency_p99_ms", "max"),
        max_ms=("latency_max_ms", "max"),
    )
    if not counters.empty:
        upstream = counters[counters["endpoint"] == upstream_endpoint]
        summary = summary.join(upstream.groupby(["gateway_id", "priority"])[["expired", "dropped"]].sum(), how="outer")
    page.note("Per gateway and priority over the whole period: worst window percentiles, "
              "and expired/dropped counts from the gateway's metrics.")
    page.table(summary.reset_index())
    gateways = sorted(latency["gateway_id"].dropna().unique())[:max_plots]
    for number, gateway in enumerate(gateways, start=1):
        _progress(f"latency plot {number}/{len(gateways)}")
        rows = latency[latency["gateway_id"] == gateway].sort_values("window_start")
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for priority, group in rows.groupby("priority"):
            line = ax.plot(group["window_start"], group["latency_p95_ms"] / 1000, marker=".", label=f"priority {priority} p95")
            ax.plot(group["window_start"], group["latency_p50_ms"] / 1000, linestyle=":", color=line[0].get_color(),
                    label=f"priority {priority} p50")
        ax.set_ylabel("latency (s)")
        ax.set_title(f"{gateway}: delivery latency by priority")
        ax.legend(fontsize="small", ncol=2)
        fig.autofmt_xdate()
        page.figure(fig, _slug("latency", gateway), f"{gateway}: p50 (dotted) and p95 latency per priority")


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
    rollups = read_output(out, "rollups")
    if rollups.empty:
        return
    page.heading("Thermostats")
    devices = rollups[["gateway_id", "device_id"]].drop_duplicates().sort_values(["gateway_id", "device_id"])
    devices = list(devices.head(max_plots).itertuples())
    for number, device in enumerate(devices, start=1):
        _progress(f"thermostat plot {number}/{len(devices)}")
        rows = rollups[(rollups["gateway_id"] == device.gateway_id) & (rollups["device_id"] == device.device_id)]
        rows = rows.sort_values("window_start")
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.fill_between(rows["window_start"], rows["temperature_min"], rows["temperature_max"], alpha=0.2,
                        color="tab:orange", label="min-max")
        ax.plot(rows["window_start"], rows["temperature_avg"], color="tab:orange", label="temperature")
        ax.step(rows["window_start"], rows["set_point_last"], where="post", color="tab:green", label="set point")
        ax.set_ylabel("°C")
        ax.set_title(f"{device.gateway_id}/{device.device_id}: temperature vs set point")
        ax.legend(fontsize="small")
        fig.autofmt_xdate()
        page.figure(fig, _slug("thermostat", device.gateway_id, device.device_id),
                    f"{device.gateway_id}/{device.device_id}")


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
    quarantine_section(page, out)
    if not page.parts:
        page.note(f"No outputs under {out}.")
    return page.write(title)
