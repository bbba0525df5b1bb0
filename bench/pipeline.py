"""Benchmark (not a test): the batch command on Spark local[2] vs. the same computation in DuckDB, fresh
and incremental, on the same landing files.

    .venv/bin/python bench/pipeline.py --records 10000000

1. Generates the history, N synthetic telemetry records (default 10 million) as landing-zone JSON lines,
   1% of them redelivered duplicates, from --gateways gateways and --devices thermostats reporting once a
   minute, and the next day's records (a day of the fleet), held back.
2. Runs, each in its own process (its memory and CPU time measured alone: the process tree's peak RSS
   and user + system seconds, sampled every 0.1 s; for Spark the Python driver, the JVM and the Python
   workers), one after the other:
   * **spark fresh**: the whole ``python -m pipeline batch --master local[2]`` command as an operator runs
     it on the history, nothing compacted or computed yet: JVM start, compaction of every landing file
     into the bronze table (``LANDING/_bronze``), every output written and counted;
   * **duckdb fresh** (2 threads): the same deduplication (first copy by receive time, landing file, send
     time), rollups, change log and latency percentiles in SQL from the same JSON files, as Parquet;
   * then the next day lands, and **spark incremental**: ``batch --from DAY``, the daily run: it compacts
     the new files only and reads and rewrites only the dates the day can touch
     (``JobSettings.read_dates``/``output_dates``);
   * **duckdb incremental**: the same SQL over the JSON files of those receive dates, its outputs kept to
     those output dates.
   * with ``--floor``, **spark floor fresh** after DuckDB's fresh run: DuckDB's work and nothing more in one
     Spark pass over the same JSON (``run_spark_floor``), the least any redesign of the batch plan could
     cost on Spark.
   Like for like but for what only Spark does: it validates readings and writes more outputs (queue
   counters, SLA, firmware, quarantine: empty or small on this data), keeps a bronze table a later run
   reads instead of the JSON, and starts a JVM.
3. Prints wall time, CPU seconds, records/s, peak memory and the load average during each run (the
   machine may be shared: read CPU seconds then), both ratios (fresh, incremental), and checks that both
   engines give the same row counts for the three outputs they both write. The children's standard
   error goes to ``WORKDIR/logs``.

See bench/RESULTS-pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
OUTPUTS = ("rollups", "setpoint_changes", "delivery_latency")
WINDOW = "5 minutes"


# -- data ------------------------------------------------------------------------------------------------
def generate(landing: Path, records: int, gateways: int, devices: int, seed: int = 7,
             chunk: int = 1_000_000, first: int = 0, tag: str = "bench") -> int:
    """Write ``records`` landing records (duplicates included) as JSON lines; returns bytes written.
    ``first``: the sequence number of the first reading (a reading a minute per thermostat, thermostat
    ``seq % devices``, minute ``seq // devices`` after T0); ``tag`` goes into the file names."""
    rng = np.random.default_rng(seed + first)
    folder = landing / "events"
    written = 0
    originals = int(records / 1.01)
    for start in range(0, originals, chunk):
        n = min(chunk, originals - start)
        seq = np.arange(first + start, first + start + n)
        device = seq % devices
        minute = seq // devices
        gateway = device % gateways
        ts = T0_MS + minute * 60_000 + device * 37 % 60_000
        latency = (rng.exponential(800, n) + 50).astype(np.int64)
        behind_outage = rng.random(n) < 0.02  # held on the gateway for minutes
        latency[behind_outage] += rng.integers(60_000, 900_000, int(behind_outage.sum()))
        received = ts + latency
        set_point = 19.0 + ((minute // (180 + device % 60)) + device) % 4
        temperature = np.round(set_point - 1.5 + rng.normal(0, 0.8, n), 2)
        heater = temperature < set_point
        frame = pd.DataFrame({
            "message_id": "gw" + pd.Series(gateway).astype(str) + ":" + pd.Series(seq).astype(str),
            "gateway_id": "gw" + pd.Series(gateway).astype(str),
            "device_id": "t" + pd.Series(device).astype(str),
            "module_id": None,
            "output": "data",
            "priority": (device % 3) * 3,
            "enqueued_ms": ts,
            "sent_ms": ts,
            "ttl_s": 3600,
            "received_ms": received,
        })
        frame["topic"] = "gateways/" + frame["gateway_id"] + "/devices/" + frame["device_id"] + "/messages/events"
        frame["content_type"] = "application/json"
        frame["payload"] = (
            '{"temperature": ' + pd.Series(temperature).astype(str)
            + ', "set_point": ' + pd.Series(set_point).astype(str)
            + ', "heater": ' + pd.Series(heater).map({True: "true", False: "false"})
            + ', "device": "' + frame["device_id"] + '", "ts_ms": ' + pd.Series(ts).astype(str) + "}"
        )
        frame["payload_base64"] = None
        frame["properties"] = [{}] * n
        frame["redelivered"] = False
        frame["reason"] = None
        copies = frame.sample(frac=0.01, random_state=seed + start).copy()  # redelivered after a lost PUBACK
        copies["received_ms"] += rng.integers(1_000, 60_000, len(copies))
        copies["redelivered"] = True
        frame = pd.concat([frame, copies], ignore_index=True)
        hours = pd.to_datetime(frame["received_ms"], unit="ms", utc=True).dt.strftime("date=%Y-%m-%d/hour=%H")
        for partition, rows in frame.groupby(hours, sort=False):
            path = folder / partition / f"part-{tag}-{start // chunk:04d}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            text = rows.to_json(orient="records", lines=True)
            path.write_text(text)
            written += len(text)
        print(f"generate {tag}: {start + n:,}/{originals:,} originals and their copies", file=sys.stderr, flush=True)
    return written


# -- engines (each run in a child process) ----------------------------------------------------------------
SPARK_PROGRESS = re.compile(r"\[\d+/\d+\] (\w+): (\d+) rows in ([\d.]+)s")


def spark_command(work: Path, master: str) -> list[str]:
    """The batch command as an operator runs it (``SPARK_LOCAL_IP`` aside, which this machine needs)."""
    return [sys.executable, "-m", "pipeline", "batch", "--landing", str(work / "landing"), "--out",
            str(work / "spark"), "--master", master]


SPARK_COMPACTION = re.compile(r"\[bronze\] (\d+) new landing lines .* in ([\d.]+)s")


def spark_result(output: str) -> dict:
    """Row counts and seconds per output from the command's progress lines, and the compaction's seconds."""
    found = SPARK_PROGRESS.findall(output)
    seconds = {name: float(s) for name, _, s in found}
    compacted = SPARK_COMPACTION.search(output)
    if compacted:
        seconds = {"compaction": float(compacted.group(2)), **seconds}
    return {"counts": {name: int(rows) for name, rows, _ in found}, "seconds": seconds}


DUCKDB_SQL = """
CREATE TEMP TABLE landed AS
SELECT * FROM read_json({events}, format = 'newline_delimited', filename = true, columns = {{
    message_id: 'VARCHAR', gateway_id: 'VARCHAR', device_id: 'VARCHAR', output: 'VARCHAR', priority: 'INTEGER',
    enqueued_ms: 'BIGINT', sent_ms: 'BIGINT', received_ms: 'BIGINT', payload: 'VARCHAR'}});

CREATE TEMP TABLE events AS
SELECT * FROM landed
QUALIFY row_number() OVER (PARTITION BY message_id ORDER BY received_ms, filename, sent_ms) = 1;

CREATE TEMP TABLE readings AS
SELECT gateway_id, device_id, message_id,
       (payload ->> '$.temperature')::DOUBLE AS temperature,
       (payload ->> '$.set_point')::DOUBLE AS set_point,
       (payload ->> '$.heater')::BOOLEAN AS heater,
       (payload ->> '$.ts_ms')::BIGINT AS reading_ms
FROM events WHERE output = 'data';
"""

DUCKDB_OUTPUTS = """
COPY (
  SELECT gateway_id, device_id, time_bucket(INTERVAL 5 MINUTE, make_timestamp(reading_ms * 1000)) AS window_start,
         count(*) AS readings, min(temperature) AS temperature_min, avg(temperature) AS temperature_avg,
         max(temperature) AS temperature_max, avg(set_point) AS set_point_avg,
         arg_max(set_point, (reading_ms, message_id)) AS set_point_last, avg(heater::INTEGER) AS heater_duty_cycle,
         strftime(time_bucket(INTERVAL 5 MINUTE, make_timestamp(reading_ms * 1000)), '%Y-%m-%d') AS date
  FROM readings WHERE temperature IS NOT NULL GROUP BY ALL
  HAVING date BETWEEN '{first}' AND '{last}'
) TO '{out}/rollups' (FORMAT PARQUET, PARTITION_BY (date), OVERWRITE_OR_IGNORE);

COPY (
  SELECT * FROM (
    SELECT gateway_id, device_id, reading_ms AS changed_ms, set_point,
           lag(set_point) OVER (PARTITION BY gateway_id, device_id ORDER BY reading_ms, message_id) AS previous_set_point,
           temperature, message_id, strftime(make_timestamp(reading_ms * 1000), '%Y-%m-%d') AS date
    FROM readings WHERE temperature IS NOT NULL
  ) WHERE previous_set_point IS DISTINCT FROM set_point AND date BETWEEN '{first}' AND '{last}'
) TO '{out}/setpoint_changes' (FORMAT PARQUET, PARTITION_BY (date), OVERWRITE_OR_IGNORE);

COPY (
  SELECT gateway_id, priority, time_bucket(INTERVAL 5 MINUTE, make_timestamp(received_ms * 1000)) AS window_start,
         count(*) AS delivered,
         quantile_disc(received_ms - enqueued_ms, [0.5, 0.95, 0.99]) AS q,
         max(received_ms - enqueued_ms) AS latency_max_ms,
         strftime(time_bucket(INTERVAL 5 MINUTE, make_timestamp(received_ms * 1000)), '%Y-%m-%d') AS date
  FROM events GROUP BY ALL
  HAVING date BETWEEN '{first}' AND '{last}'
) TO '{out}/delivery_latency' (FORMAT PARQUET, PARTITION_BY (date), OVERWRITE_OR_IGNORE);
"""


def run_duckdb(work: Path, threads: int, received_from: str | None) -> dict:
    """The three outputs in DuckDB from the landing JSON: all of it (``received_from`` None), or, as
    ``batch --from received_from`` does, the receive dates that run reads and the output dates it
    rewrites (``JobSettings.read_dates`` / ``output_dates``, the command's default ``--late-days``)."""
    started = time.monotonic()
    import duckdb

    from pipeline.jobs.settings import JobSettings

    out = work / "duckdb"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    connection = duckdb.connect(config={"threads": threads})
    ready = time.monotonic()
    events = work / "landing" / "events"
    if received_from is None:
        files, (first, last) = [str(events / "*" / "*" / "*.jsonl")], ("0000-00-00", "9999-99-99")
    else:
        settings = JobSettings(str(work / "landing"), str(out), received_from=received_from)
        files = [str(events / f"date={day}" / "*" / "*.jsonl") for day in settings.read_dates()
                 if (events / f"date={day}").is_dir()]
        first, last = settings.output_dates()
    connection.execute(DUCKDB_SQL.format(events="[" + ", ".join(f"'{name}'" for name in files) + "]"))
    connection.execute(DUCKDB_OUTPUTS.format(out=out, first=first, last=last))
    counts = {
        name: connection.execute(f"SELECT count(*) FROM read_parquet('{out / name}/*/*.parquet')").fetchone()[0]
        for name in OUTPUTS
    }
    done = time.monotonic()
    return {"startup_s": ready - started, "job_s": done - ready, "counts": counts}


def run_spark_floor(work: Path, master: str) -> dict:
    """``--floor``: the least any Spark plan can do here, DuckDB's work and nothing more, in one pass over the
    history's JSON: Spark's JSON file source with a schema (its byte-level parser, which the product cannot
    use: it makes a JSON array several rows), ``from_json`` of the payload, the job's candidate-key
    deduplication, one cached frame, the job's rollups, change log and latency, three outputs written three
    at a time. No bronze table, no validation, no other outputs, no exactly-once bookkeeping: not a job
    anyone should run, the bound a redesign of the batch plan could approach (bench/RESULTS-pipeline.md)."""
    from concurrent.futures import ThreadPoolExecutor

    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pipeline.jobs import delivery, rollups, setpoints
    from pipeline.jobs.dedup import mark_repeated_copies
    from pipeline.spark import session

    started = time.monotonic()
    spark = session(master, "pipeline-floor")
    out = work / "spark-floor"
    schema = ("message_id string, gateway_id string, device_id string, output string, priority int, "
              "enqueued_ms long, sent_ms long, received_ms long, payload string")
    lines = spark.read.schema(schema).json(str(work / "landing" / "events" / "date=*" / "hour=*" / "*.jsonl"))
    parsed = lines.select("*", F.col("_metadata.file_path").alias("landing_file"), F.from_json(
        "payload", "temperature double, set_point double, heater boolean, ts_ms long").alias("t")).drop("payload")
    reading = (F.col("output") == "data") & F.col("t.temperature").isNotNull()
    marked = mark_repeated_copies(parsed.withColumn("_reading", reading),
                                  {"_event": F.lit(True), "_first_reading": F.col("_reading")}, F.lit(True))
    events = marked.where("_event or _first_reading").select(
        "message_id", "gateway_id", "device_id", "priority", "enqueued_ms", "received_ms", "sent_ms", "_event",
        "_first_reading", F.col("t.temperature").alias("temperature"), F.col("t.set_point").alias("set_point"),
        F.col("t.heater").alias("heater"), F.col("t.ts_ms").alias("reading_ms"),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    readings = events.where("_first_reading").withColumn("reading_at", F.timestamp_millis("reading_ms"))
    outputs = {"rollups": rollups.rollups(readings, WINDOW), "setpoint_changes": setpoints.changes(readings),
               "delivery_latency": delivery.latency(events.where("_event"), WINDOW)}
    ready = time.monotonic()

    def write(name: str) -> int:
        outputs[name].write.mode("overwrite").partitionBy("date").parquet(str(out / name))
        return spark.read.parquet(str(out / name)).count()

    with ThreadPoolExecutor(len(outputs)) as pool:
        counts = dict(zip(outputs, pool.map(write, outputs), strict=True))
    done = time.monotonic()
    spark.stop()
    return {"startup_s": ready - started, "job_s": done - ready, "counts": counts}


class Measured(NamedTuple):
    output: str
    peak_rss: int  # bytes, the process tree's
    wall_s: float
    cpu_s: float  # user + system of every process of the tree
    load: tuple[float, float]  # lowest and highest 1-minute load average while it ran


def measured(command: list[str], log: Path) -> Measured:
    """Run a child (its standard error into ``log``: Spark's progress bars and warnings) and measure it.
    CPU time is summed per process of the tree (the Python driver, the JVM, Python workers), each
    process's last reading, sampled every 0.1 s: a process that lives less than that is missed."""
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT,
                                   env=dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")))
    peak, loads, cpu, stop = [0], [os.getloadavg()[0]], {}, threading.Event()

    def sample():
        root = psutil.Process(process.pid)
        while not stop.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                tree = []
            rss = 0
            for member in tree:
                try:
                    with member.oneshot():
                        rss += member.memory_info().rss
                        times = member.cpu_times()
                        cpu[member.pid] = times.user + times.system
                except psutil.Error:
                    pass
            peak[0] = max(peak[0], rss)
            loads.append(os.getloadavg()[0])
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = process.communicate()
    stop.set()
    sampler.join()
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed with status {process.returncode} (see {log})")
    return Measured(output, peak[0], time.monotonic() - started, sum(cpu.values()), (min(loads), max(loads)))


def next_day(records: int, devices: int) -> tuple[int, str]:
    """The first reading of the day after the history's last one (sequence number), and that day."""
    last_minute = int(records / 1.01) // devices
    day = (last_minute // 1440 + 1)
    return day * 1440 * devices, time.strftime("%Y-%m-%d", time.gmtime(T0_MS / 1000 + day * 86_400))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000, help="the history, landed before the fresh run")
    parser.add_argument("--day-records", type=int,
                        help="the next day, landed before the incremental run (default: a day of the fleet, "
                             "--devices readings a minute, at most --records)")
    parser.add_argument("--gateways", type=int, default=20)
    parser.add_argument("--devices", type=int, default=2_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", help="keep data and outputs here (default: a temporary folder, removed)")
    parser.add_argument("--reuse-data", action="store_true", help="keep the landing zone already in --workdir")
    parser.add_argument("--floor", action="store_true",
                        help="also run the floor of any Spark plan after the fresh runs (run_spark_floor)")
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # child mode: duckdb-all or duckdb-from-YYYY-MM-DD
    args = parser.parse_args(argv)

    if args.engine == "spark-floor":  # child mode: the floor of a Spark plan (--floor)
        print(json.dumps(run_spark_floor(Path(args.workdir), args.master)))
        return 0
    if args.engine:  # child mode: DuckDB in its own process
        received_from = None if args.engine == "duckdb-all" else args.engine.removeprefix("duckdb-from-")
        print(json.dumps(run_duckdb(Path(args.workdir), threads=2, received_from=received_from)))
        return 0

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    day_first, day = next_day(args.records, args.devices)
    day_records = min(args.day_records or int(1440 * args.devices * 1.01), args.records)
    held = work / "next-day"  # the next day's landing files, generated with the history, landed later
    runs = []
    try:
        if not (work / "landing").is_dir() or not args.reuse_data:
            for folder in (work / "landing", held):
                shutil.rmtree(folder, ignore_errors=True)
            started = time.monotonic()
            size = generate(work / "landing", args.records, args.gateways, args.devices)
            day_size = generate(held, day_records, args.gateways, args.devices, first=day_first, tag=f"day-{day}")
            print(f"generated {args.records:,} records ({size / 1e6:,.0f} MB of JSON lines) and the next day, {day}, "
                  f"{day_records:,} records ({day_size / 1e6:,.0f} MB) in {time.monotonic() - started:.0f}s", flush=True)
        unland(work / "landing", held)
        for folder in (work / "landing" / "_bronze", work / "spark"):  # fresh: nothing compacted or written yet
            shutil.rmtree(folder, ignore_errors=True)
        duckdb = [sys.executable, __file__, "--workdir", str(work), "--engine"]
        for name, command, before in [
            ("spark fresh", spark_command(work, args.master), None),
            ("duckdb fresh", [*duckdb, "duckdb-all"], None),
            *([("spark floor fresh", [*duckdb, "spark-floor", "--master", args.master], None)] if args.floor else []),
            ("spark incremental", [*spark_command(work, args.master), "--from", day], lambda: land(held, work / "landing")),
            ("duckdb incremental", [*duckdb, f"duckdb-from-{day}"], None),
        ]:
            if before:
                before()
            if name.startswith("duckdb"):
                shutil.rmtree(work / "duckdb", ignore_errors=True)
            run = measured(command, work / "logs" / f"{name.replace(' ', '-')}.log")
            by_command = name.startswith("spark") and "floor" not in name  # the command's progress lines, else JSON
            result = spark_result(run.output) if by_command else json.loads(run.output.strip().splitlines()[-1])
            runs.append((name, run, result))
            print(f"{name}: {run.wall_s:.1f}s, CPU {run.cpu_s:.1f}s, peak {run.peak_rss / 2**20:,.0f} MB, "
                  f"load {run.load[0]:.1f}-{run.load[1]:.1f}", flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nhistory {args.records:,} records, then the next day ({day}) {day_records:,}")
    print(f"{'run':<20}{'wall s':>8}{'CPU s':>8}{'records/s':>12}{'peak MB':>9}{'load avg':>12}")
    for name, run, _ in runs:
        n = args.records if "fresh" in name else day_records
        print(f"{name:<20}{run.wall_s:>8.1f}{run.cpu_s:>8.1f}{n / run.wall_s:>12,.0f}{run.peak_rss / 2**20:>9,.0f}"
              f"{run.load[0]:>6.1f}-{run.load[1]:<5.1f}")
    for name, _, result in runs:
        detail = result["seconds"] if "seconds" in result else {"sql": round(result["job_s"], 1),
                                                                 "start": round(result["startup_s"], 1)}
        print(f"{name} seconds:", json.dumps(detail))
    walls = {name: run.wall_s for name, run, _ in runs}
    cpus = {name: run.cpu_s for name, run, _ in runs}
    for mode in ("fresh", "incremental"):
        print(f"{mode}: spark / duckdb wall x{walls[f'spark {mode}'] / walls[f'duckdb {mode}']:.1f}, "
              f"CPU x{cpus[f'spark {mode}'] / cpus[f'duckdb {mode}']:.1f}")
    if "spark floor fresh" in walls:
        print(f"floor (DuckDB's work in one Spark pass): spark floor / duckdb wall "
              f"x{walls['spark floor fresh'] / walls['duckdb fresh']:.1f}, CPU x{cpus['spark floor fresh'] / cpus['duckdb fresh']:.1f}")
    disagree = 0
    for mode in ("fresh", "incremental"):
        counts = [{name: result["counts"].get(name) for name in OUTPUTS} for name, _, result in runs if mode in name]
        print(f"{mode} output rows:", json.dumps(counts[0]))
        if any(count != counts[0] for count in counts):
            print(f"WARNING: the {mode} runs disagree on output row counts:", counts, file=sys.stderr)
            disagree = 1
    return disagree


def unland(landing: Path, held: Path) -> None:
    """Move the next day's files back out of the landing zone (a rerun over kept data)."""
    for path in sorted(landing.rglob("part-day-*.jsonl")):
        target = held / path.relative_to(landing)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.rename(target)


def land(held: Path, landing: Path) -> None:
    """The next day's files into the landing zone, as the ingest seals them (a rename each)."""
    for path in sorted(held.rglob("*.jsonl")):
        target = landing / path.relative_to(held)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.rename(target)


if __name__ == "__main__":
    sys.exit(main())
