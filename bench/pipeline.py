"""Benchmark (not a test): the batch job on Spark local[2] vs. the same computation in DuckDB.

    .venv/bin/python bench/pipeline.py --records 1000000

1. Generates N synthetic telemetry records (default 10 million) as landing-zone JSON lines, 1% of them
   redelivered duplicates, from --gateways gateways and --devices thermostats reporting once a minute.
2. Runs, each in its own process so that its memory is measured alone (peak RSS of the process tree,
   sampled every 0.1 s; for Spark that is the Python driver, the JVM and the Python workers), on fresh
   outputs, one after the other:
   * the whole ``python -m pipeline batch --master local[2]`` command on fresh data, end to end: JVM
     start, compaction of every landing file into the bronze table (``LANDING/_bronze``), every output
     written and counted, with the command's own defaults (driver memory, shuffle partitions);
   * the same command with ``--no-compact`` once the bronze table exists (what a run costs when a cron
     ``compact`` or the streaming job keeps the table up to date);
   * DuckDB (2 threads): the same deduplication (first copy by receive time, landing file, send time),
     rollups, change log and latency percentiles in SQL, written as Parquet, once from the JSON landing
     files (parsing the payloads itself) and once from the bronze table's Parquet (the columns those
     outputs read, as Spark reads them). Like for like but for what only Spark does: it validates
     readings and writes three more outputs (queue counters, SLA, quarantine: empty or a copy of the
     latency windows on this data, which has no metrics and no rejects), and starts a JVM (~10 s of the
     Spark figures at any size); over JSON DuckDB does not validate the payloads either.
3. Prints wall time, records/s, peak memory and the load average during each run (the machine is
   shared), the ratios, and checks that every run gives the same row counts for the three outputs all of
   them write.

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
             chunk: int = 1_000_000) -> int:
    """Write ``records`` landing records (duplicates included) as JSON lines; returns bytes written."""
    rng = np.random.default_rng(seed)
    folder = landing / "events"
    written = 0
    originals = int(records / 1.01)
    for start in range(0, originals, chunk):
        n = min(chunk, originals - start)
        seq = np.arange(start, start + n)
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
            path = folder / partition / f"part-bench-{start // chunk:04d}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            text = rows.to_json(orient="records", lines=True)
            path.write_text(text)
            written += len(text)
        print(f"generate: {start + n:,}/{originals:,} originals and their copies", file=sys.stderr, flush=True)
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
SELECT * FROM read_json('{events}', format = 'newline_delimited', filename = true, columns = {{
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

# The same rows from the bronze table (compaction parsed the payloads): what the batch job reads once it
# exists, the columns the three outputs need, each message's first copy in the job's order (dedup.COPY_ORDER).
# A glob of the table's files, not its _spark_metadata log: right for a table no compaction was killed in.
DUCKDB_BRONZE = """
CREATE TEMP TABLE events AS
SELECT message_id, gateway_id, device_id, output, priority, enqueued_ms, received_ms, reason,
       t_temperature, t_set_point, t_heater, t_ts_ms
FROM read_parquet('{bronze}/events/date=*/*.parquet')
WHERE landing_error IS NULL
QUALIFY row_number() OVER (PARTITION BY message_id ORDER BY received_ms, landing_file, sent_ms) = 1;

CREATE TEMP TABLE readings AS
SELECT gateway_id, device_id, message_id, t_temperature AS temperature, t_set_point AS set_point,
       t_heater AS heater, t_ts_ms AS reading_ms
FROM events WHERE output = 'data' AND reason IS NULL;
"""

DUCKDB_OUTPUTS = """
COPY (
  SELECT gateway_id, device_id, time_bucket(INTERVAL 5 MINUTE, make_timestamp(reading_ms * 1000)) AS window_start,
         count(*) AS readings, min(temperature) AS temperature_min, avg(temperature) AS temperature_avg,
         max(temperature) AS temperature_max, avg(set_point) AS set_point_avg,
         arg_max(set_point, reading_ms) AS set_point_last, avg(heater::INTEGER) AS heater_duty_cycle,
         strftime(time_bucket(INTERVAL 5 MINUTE, make_timestamp(reading_ms * 1000)), '%Y-%m-%d') AS date
  FROM readings WHERE temperature IS NOT NULL GROUP BY ALL
) TO '{out}/rollups' (FORMAT PARQUET, PARTITION_BY (date), OVERWRITE_OR_IGNORE);

COPY (
  SELECT * FROM (
    SELECT gateway_id, device_id, reading_ms AS changed_ms, set_point,
           lag(set_point) OVER (PARTITION BY gateway_id, device_id ORDER BY reading_ms, message_id) AS previous_set_point,
           temperature, message_id, strftime(make_timestamp(reading_ms * 1000), '%Y-%m-%d') AS date
    FROM readings WHERE temperature IS NOT NULL
  ) WHERE previous_set_point IS DISTINCT FROM set_point
) TO '{out}/setpoint_changes' (FORMAT PARQUET, PARTITION_BY (date), OVERWRITE_OR_IGNORE);

COPY (
  SELECT gateway_id, priority, time_bucket(INTERVAL 5 MINUTE, make_timestamp(received_ms * 1000)) AS window_start,
         count(*) AS delivered,
         quantile_disc(received_ms - enqueued_ms, [0.5, 0.95, 0.99]) AS q,
         max(received_ms - enqueued_ms) AS latency_max_ms,
         strftime(time_bucket(INTERVAL 5 MINUTE, make_timestamp(received_ms * 1000)), '%Y-%m-%d') AS date
  FROM events GROUP BY ALL
) TO '{out}/delivery_latency' (FORMAT PARQUET, PARTITION_BY (date), OVERWRITE_OR_IGNORE);
"""


def run_duckdb(work: Path, threads: int, source: str) -> dict:
    """``source``: ``json`` (the landing files) or ``bronze`` (the table a Spark run compacted)."""
    started = time.monotonic()
    import duckdb

    out = work / "duckdb"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    connection = duckdb.connect(config={"threads": threads})
    ready = time.monotonic()
    if source == "json":
        connection.execute(DUCKDB_SQL.format(events=work / "landing" / "events" / "*" / "*" / "*.jsonl"))
    else:
        connection.execute(DUCKDB_BRONZE.format(bronze=work / "landing" / "_bronze"))
    connection.execute(DUCKDB_OUTPUTS.format(out=out))
    counts = {
        name: connection.execute(f"SELECT count(*) FROM read_parquet('{out / name}/*/*.parquet')").fetchone()[0]
        for name in OUTPUTS
    }
    done = time.monotonic()
    return {"startup_s": ready - started, "job_s": done - ready, "counts": counts}


def measured(command: list[str]) -> tuple[str, int, float, tuple[float, float]]:
    """Run a child; returns its standard output, the peak RSS of its process tree, the wall time and the
    lowest and highest 1-minute load average seen while it ran."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env=dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")))
    peak, loads, stop = [0], [os.getloadavg()[0]], threading.Event()

    def sample():
        root = psutil.Process(process.pid)
        while not stop.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            loads.append(os.getloadavg()[0])
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = process.communicate()
    stop.set()
    sampler.join()
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed with status {process.returncode}")
    return output, peak[0], time.monotonic() - started, (min(loads), max(loads))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--gateways", type=int, default=20)
    parser.add_argument("--devices", type=int, default=2_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", help="keep data and outputs here (default: a temporary folder, removed)")
    parser.add_argument("--reuse-data", action="store_true", help="keep the landing zone already in --workdir")
    parser.add_argument("--bronze-exists", action="store_true",
                        help="keep the bronze table already in --workdir (a 'pipeline compact' over its landing zone) "
                             "and skip the fresh compact + batch run")
    parser.add_argument("--engine", choices=["duckdb-json", "duckdb-bronze"], help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args(argv)

    if args.engine:  # child mode: DuckDB in its own process
        print(json.dumps(run_duckdb(Path(args.workdir), threads=2, source=args.engine.removeprefix("duckdb-"))))
        return 0

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    runs = []
    try:
        if not (work / "landing").is_dir() or not args.reuse_data:
            shutil.rmtree(work / "landing", ignore_errors=True)
            started = time.monotonic()
            size = generate(work / "landing", args.records, args.gateways, args.devices)
            print(f"generated {args.records:,} records ({size / 1e6:,.0f} MB of JSON lines) "
                  f"in {time.monotonic() - started:.0f}s", flush=True)
        if not args.bronze_exists:
            shutil.rmtree(work / "landing" / "_bronze", ignore_errors=True)  # fresh: nothing compacted yet
        fresh = [] if args.bronze_exists else [("spark: compact + batch, fresh", spark_command(work, args.master))]
        for name, command in [
            *fresh,
            ("spark: batch, bronze exists", [*spark_command(work, args.master), "--no-compact"]),
            ("duckdb: JSON landing files", [sys.executable, __file__, "--workdir", str(work), "--engine", "duckdb-json"]),
            ("duckdb: bronze Parquet", [sys.executable, __file__, "--workdir", str(work), "--engine", "duckdb-bronze"]),
        ]:
            shutil.rmtree(work / "spark", ignore_errors=True)
            output, peak, wall, load = measured(command)
            result = spark_result(output) if name.startswith("spark") else json.loads(output.strip().splitlines()[-1])
            runs.append((name, wall, peak, load, result))
            print(f"{name}: {wall:.1f}s, peak {peak / 2**20:,.0f} MB, load {load[0]:.1f}-{load[1]:.1f}", flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    n = args.records
    print(f"\n{'run':<34}{'wall s':>8}{'records/s':>12}{'peak MB':>9}{'load avg':>12}")
    for name, wall, peak, load, _ in runs:
        print(f"{name:<34}{wall:>8.1f}{n / wall:>12,.0f}{peak / 2**20:>9,.0f}{load[0]:>6.1f}-{load[1]:<5.1f}")
    for name, _, _, _, result in runs:
        detail = result["seconds"] if "seconds" in result else {"sql": round(result["job_s"], 1),
                                                                 "start": round(result["startup_s"], 1)}
        print(f"{name} seconds:", json.dumps(detail))
    walls = {name: wall for name, wall, *_ in runs}
    print(f"spark batch with bronze / duckdb over bronze: x{walls['spark: batch, bronze exists'] / walls['duckdb: bronze Parquet']:.1f}; "
          f"/ duckdb over JSON: x{walls['spark: batch, bronze exists'] / walls['duckdb: JSON landing files']:.1f}")
    counts = [{name: result["counts"].get(name) for name in OUTPUTS} for *_, result in runs]
    print("output rows:", json.dumps(counts[0]))
    if any(count != counts[0] for count in counts):
        print("WARNING: the runs disagree on output row counts:", counts, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
