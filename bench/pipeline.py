"""Benchmark (not a test): the batch job on Spark local[2] vs. the same computation in DuckDB.

    .venv/bin/python bench/pipeline.py --records 1000000

1. Generates N synthetic telemetry records (default 10 million) as landing-zone JSON lines, 1% of them
   redelivered duplicates, from --gateways gateways and --devices thermostats reporting once a minute.
2. Runs, each in its own process so that its memory is measured alone (peak RSS of the process tree,
   sampled every 0.1 s; for Spark that is the Python driver, the JVM and the Python workers):
   * spark: ``pipeline.jobs.batch.build`` on ``--master`` (default local[2]), writing the three
     heavy outputs - rollups, set-point change log, delivery latency - as partitioned Parquet;
   * duckdb: the same deduplication, parsing, rollups, change log and latency percentiles in SQL over the
     same files, written as Parquet.
3. Prints records/s, peak memory and the Spark/DuckDB ratios, and checks the two agree on row counts.

Spark's time is reported with and without its start-up (JVM, session). See bench/RESULTS-pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
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
def run_spark(work: Path, master: str) -> dict:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    started = time.monotonic()
    from pipeline.jobs import batch
    from pipeline.jobs.settings import JobSettings
    from pipeline.spark import session

    spark = session(master, "bench-pipeline", conf={"spark.ui.showConsoleProgress": "false",
                                                   "spark.driver.memory": "4g"})
    spark.sparkContext.setLogLevel("ERROR")
    ready = time.monotonic()
    settings = JobSettings(str(work / "landing"), str(work / "spark"), window=WINDOW)
    outputs = batch.build(spark, settings)
    counts = {}
    for name in OUTPUTS:
        outputs[name].write.mode("overwrite").partitionBy("date").parquet(settings.output(name))
        counts[name] = spark.read.parquet(settings.output(name)).count()
        print(f"spark: {name} done at {time.monotonic() - ready:.1f}s", file=sys.stderr, flush=True)
    done = time.monotonic()
    spark.stop()
    return {"startup_s": ready - started, "job_s": done - ready, "counts": counts}


DUCKDB_SQL = """
CREATE TEMP TABLE landed AS
SELECT * FROM read_json('{events}', format = 'newline_delimited', columns = {{
    message_id: 'VARCHAR', gateway_id: 'VARCHAR', device_id: 'VARCHAR', output: 'VARCHAR', priority: 'INTEGER',
    enqueued_ms: 'BIGINT', received_ms: 'BIGINT', payload: 'VARCHAR'}});

CREATE TEMP TABLE events AS
SELECT * FROM landed QUALIFY row_number() OVER (PARTITION BY message_id ORDER BY received_ms) = 1;

CREATE TEMP TABLE readings AS
SELECT gateway_id, device_id, message_id,
       (payload ->> '$.temperature')::DOUBLE AS temperature,
       (payload ->> '$.set_point')::DOUBLE AS set_point,
       (payload ->> '$.heater')::BOOLEAN AS heater,
       (payload ->> '$.ts_ms')::BIGINT AS reading_ms
FROM events WHERE output = 'data';

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


def run_duckdb(work: Path, threads: int) -> dict:
    started = time.monotonic()
    import duckdb

    out = work / "duckdb"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    connection = duckdb.connect(config={"threads": threads})
    ready = time.monotonic()
    connection.execute(DUCKDB_SQL.format(events=work / "landing" / "events" / "*" / "*" / "*.jsonl", out=out))
    counts = {
        name: connection.execute(f"SELECT count(*) FROM read_parquet('{out / name}/*/*.parquet')").fetchone()[0]
        for name in OUTPUTS
    }
    done = time.monotonic()
    return {"startup_s": ready - started, "job_s": done - ready, "counts": counts}


def measured(command: list[str]) -> tuple[dict, int, float]:
    """Run a child; returns its JSON result, the peak RSS of its process tree and the wall time."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    peak, stop = [0], threading.Event()

    def sample():
        root = psutil.Process(process.pid)
        while not stop.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = process.communicate()
    stop.set()
    sampler.join()
    if process.returncode:
        raise SystemExit(f"{' '.join(command[-2:])} failed with status {process.returncode}")
    return json.loads(output.strip().splitlines()[-1]), peak[0], time.monotonic() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--gateways", type=int, default=20)
    parser.add_argument("--devices", type=int, default=2_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", help="keep data and outputs here (default: a temporary folder, removed)")
    parser.add_argument("--engine", choices=["spark", "duckdb"], help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args(argv)

    if args.engine:
        work = Path(args.workdir)
        result = run_spark(work, args.master) if args.engine == "spark" else run_duckdb(work, threads=2)
        print(json.dumps(result))
        return 0

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        shutil.rmtree(work / "landing", ignore_errors=True)
        started = time.monotonic()
        size = generate(work / "landing", args.records, args.gateways, args.devices)
        print(f"generated {args.records:,} records ({size / 1e6:,.0f} MB of JSON lines) "
              f"in {time.monotonic() - started:.0f}s", flush=True)
        me = [sys.executable, __file__, "--workdir", str(work), "--master", args.master]
        spark, spark_peak, spark_wall = measured(me + ["--engine", "spark"])
        duck, duck_peak, duck_wall = measured(me + ["--engine", "duckdb"])
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    n = args.records
    rows = [
        ("spark " + args.master, spark, spark_peak, spark_wall),
        ("duckdb (2 threads)", duck, duck_peak, duck_wall),
    ]
    print(f"\n{'engine':<20}{'job s':>8}{'startup s':>11}{'records/s':>12}{'peak MB':>9}")
    for name, result, peak, _ in rows:
        print(f"{name:<20}{result['job_s']:>8.1f}{result['startup_s']:>11.1f}{n / result['job_s']:>12,.0f}"
              f"{peak / 2**20:>9,.0f}")
    print(f"\nspark/duckdb: time x{spark['job_s'] / duck['job_s']:.1f} (x{spark_wall / duck_wall:.1f} with start-up), "
          f"peak memory x{spark_peak / duck_peak:.1f}")
    print("output rows:", json.dumps(spark["counts"]), "(spark)", json.dumps(duck["counts"]), "(duckdb)")
    if spark["counts"] != duck["counts"]:
        print("WARNING: the engines disagree on output row counts", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
