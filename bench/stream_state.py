"""Benchmark (not a test): the streaming job's stateful operator, ``applyInPandasWithState`` (what
``OrderedFold.stream`` uses) against ``transformWithStateInPandas`` (Spark 4), on the same data.

    .venv/bin/pip install protobuf   # transformWithStateInPandas talks to its state server in protobuf
    .venv/bin/python bench/stream_state.py --records 200000

Both run the one per-key function the job runs (``OrderedFold.per_key``: the set-point change log,
thermostat by thermostat, with deduplication) over the same bronze table (bench/pipeline.py's generator,
compacted once, one file per landing file), read as the streaming job reads it, in
``--files-per-trigger`` micro-batches (``availableNow``), into a no-op sink; only the state API around
the function differs. ``transformWithStateInPandas`` keeps the same state tuple in one ``ValueState``
(it needs the RocksDB state store, which is set for both runs so that the store is not the difference).
Each variant runs in its own process, fresh checkpoint, ``--repeat`` times. Prints seconds per run and
the output row counts, which must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LATENESS_MS = 10 * 60_000
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def run_variant(work: Path, variant: str, files_per_trigger: int) -> dict:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    from pipeline.jobs import bronze, setpoints, telemetry
    from pipeline.jobs.ordered import STATE_SCHEMA
    from pipeline.jobs.source import StreamOptions, records
    from pipeline.records import EVENTS
    from pipeline.spark import session

    spark = session("local[2]", f"bench-state-{variant}", conf={
        "spark.ui.showConsoleProgress": "false", "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    })
    spark.sparkContext.setLogLevel("ERROR")
    if variant == "compact":  # the bronze table both variants read, one file per landing file and kind
        bronze.compact(spark, str(work / "landing"), str(work / "bronze"), StreamOptions(1))
        spark.stop()
        return {}
    readings = telemetry.readings(telemetry.parse(records(bronze.read(
        spark, str(work / "bronze"), EVENTS, stream=StreamOptions(files_per_trigger)))))
    fold = setpoints.FOLD
    keyed = readings.select(*fold.keys, *fold._read()).groupBy(*fold.keys)
    run = fold.per_key(LATENESS_MS)
    if variant == "applyInPandasWithState":
        changes = fold.stream(readings, LATENESS_MS)
    else:
        class GroupStateOverValueState:
            """The three calls ``run`` makes on a GroupState, on a ValueState holding the same tuple."""

            def __init__(self, value):
                self.value = value

            @property
            def exists(self) -> bool:
                return self.value.exists()

            @property
            def get(self) -> tuple:
                return tuple(self.value.get())

            def update(self, row: tuple) -> None:
                self.value.update(row)

        class Fold(StatefulProcessor):
            def init(self, handle) -> None:
                self.state = GroupStateOverValueState(handle.getValueState("fold", STATE_SCHEMA))

            def handleInputRows(self, key, rows, timerValues):
                yield from run(key, rows, self.state)

            def close(self) -> None:
                pass

        changes = keyed.transformWithStateInPandas(Fold(), fold.output, "Append", "None")
    started = time.monotonic()
    query = (changes.writeStream.format("noop").outputMode("append").trigger(availableNow=True)
             .option("checkpointLocation", str(work / f"checkpoint-{variant}")).start())
    query.awaitTermination()
    elapsed = time.monotonic() - started
    rows = sum(p.get("numOutputRows", 0) or 0 for p in (b.get("sink", {}) for b in query.recentProgress))
    batches = len(query.recentProgress)
    spark.stop()
    del pd
    return {"seconds": elapsed, "rows": rows, "micro_batches": batches}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--files-per-trigger", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(Path(args.workdir), args.variant, args.files_per_trigger)))
        return 0

    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_pipeline", ROOT / "bench" / "pipeline.py")
    assert spec and spec.loader
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-state-"))
    if not (work / "landing").is_dir():
        generator.generate(work / "landing", args.records, 10, args.devices, chunk=args.records // 20)
    if not (work / "bronze").is_dir():
        subprocess.run([sys.executable, __file__, "--workdir", str(work), "--variant", "compact"], check=True, cwd=ROOT)
    results: dict[str, list[dict]] = {}
    for _ in range(args.repeat):
        for variant in ("applyInPandasWithState", "transformWithStateInPandas"):
            shutil.rmtree(work / f"checkpoint-{variant}", ignore_errors=True)
            load = os.getloadavg()[0]
            done = subprocess.run([sys.executable, __file__, "--workdir", str(work), "--variant", variant,
                                   "--files-per-trigger", str(args.files_per_trigger)],
                                  capture_output=True, text=True, cwd=ROOT)
            if done.returncode:
                raise SystemExit(done.stderr[-5000:])
            result = json.loads(done.stdout.strip().splitlines()[-1]) | {"load": load}
            results.setdefault(variant, []).append(result)
            print(variant, json.dumps(result), flush=True)
    rows = {variant: {run["rows"] for run in runs} for variant, runs in results.items()}
    print("output rows per variant:", rows)
    return 0 if len({frozenset(r) for r in rows.values()}) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
