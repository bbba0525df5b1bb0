"""The one place that builds a SparkSession, so the CLI, the tests and the benchmark run the same settings.

``master=None`` means ``local[*]``, except under ``spark-submit``, whose ``--master`` then stands. On a
local master the Python workers are this interpreter (``PYSPARK_PYTHON``, default ``sys.executable``), so
pandas UDFs find the same packages as the driver without any setup; on a cluster the cluster's
``PYSPARK_PYTHON`` / ``spark.pyspark.python`` applies.
"""

from __future__ import annotations

import os
import sys
import warnings

# pyspark 4.x warns on every import that it does not fully support pandas 3; the features used here are
# covered by the tests, so keep the noise out of the driver and of the Python workers.
_PANDAS_WARNING = "PySpark does not yet fully support pandas"
warnings.filterwarnings("ignore", message=_PANDAS_WARNING, category=FutureWarning)


def session(master: str | None = None, app_name: str = "pipeline", shuffle_partitions: int | None = None,
            conf: dict[str, str] | None = None):
    from pyspark.sql import SparkSession

    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # set by spark-submit for the Python driver
    if master is None and not under_submit:
        master = "local[*]"
    builder = SparkSession.builder.appName(app_name)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.files.openCostInBytes": FILE_OPEN_COST,
        "spark.executorEnv.PYTHONWARNINGS": f"ignore:{_PANDAS_WARNING}:FutureWarning",
    }
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # what pyspark starts workers with
            settings.update(local_settings(local_cores(master)))
            os.environ.setdefault("PYTHONWARNINGS", settings["spark.executorEnv.PYTHONWARNINGS"])
    if shuffle_partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


LOCAL_DRIVER_MEMORY = "4g"
# C2 compiles only what stays hot. A batch run's planner, optimiser and generated-code methods are warm
# for a moment and never again, and at the JVM's default thresholds C2 compiled thousands of them (the JIT
# was the largest single CPU cost of a run). At 40 times the calls and 10 times the loop iterations those
# stay with C1, while the per-row code, run millions of times, still reaches C2 within its first few
# percent of rows. Measurements: bench/RESULTS-pipeline.md, "Where a run's CPU goes" (session 11).
C2_THRESHOLDS = ("-XX:Tier4InvocationThreshold=200000", "-XX:Tier4MinInvocationThreshold=100000",
                 "-XX:Tier4CompileThreshold=250000", "-XX:Tier4BackEdgeThreshold=400000")
LOCAL_JAVA_OPTIONS = " ".join(("-XX:+UseParallelGC", *C2_THRESHOLDS))

# What opening a file costs, in bytes of reading, when Spark packs files into read tasks. Spark's 4 MiB
# made each of many small sealed landing files (the ingest seals one a minute) weigh as much as 4 MiB of
# data: a compaction over 2,000 files of a few KiB was 60 tasks, and every task writes a Parquet file per
# date it holds, so the bronze table got thousands of tiny files. At 256 KiB such files fill tasks of
# Spark's 128 MiB, still split over the cores (docs/pipeline.md "Small files").
FILE_OPEN_COST = "256k"


def local_cores(master: str) -> int:
    """The task slots of a local master: ``local`` 1, ``local[N]`` (or ``local[N,retries]``) N, ``local[*]``
    the machine's cores."""
    inside = master.partition("[")[2].partition("]")[0].split(",")[0]
    if not inside:
        return 1
    return (os.cpu_count() or 1) if inside == "*" else int(inside)


def local_settings(cores: int) -> dict[str, str]:
    """Memory and shuffle settings for one machine (a cluster keeps its own, or ``--shuffle-partitions``).

    Spark's default of 200 shuffle partitions is made for clusters: on two cores it is 200 tasks of
    start-up per shuffle and up to 200 files per written partition. Four per core give each core a few
    tasks to balance skew with; adaptive execution then merges what is small (an aggregated output of a
    few thousand rows) into partitions of its advisory 64 MiB instead of keeping one per core
    (``parallelismFirst`` off), so the small outputs are written as one or two files, in one or two tasks.
    """
    return {
        # The driver is the executor on a local master, and Spark's 1 GiB heap ran out of memory sorting
        # 10 million events for deduplication (bench/RESULTS-pipeline.md); a cluster sizes its own.
        "spark.driver.memory": LOCAL_DRIVER_MEMORY,
        # The JVM's throughput collector rather than its default G1, whose concurrent marking and
        # remembered-set upkeep run beside a batch job's allocation-heavy tasks: 3M records, the batch
        # outputs cost 12-14 % less JVM CPU, a 1M compaction 7-8 % (bench/RESULTS-pipeline.md). Its pauses,
        # which G1 keeps short, do not matter to a batch job. Then fewer C2 compilations (``C2_THRESHOLDS``).
        "spark.driver.extraJavaOptions": LOCAL_JAVA_OPTIONS,
        "spark.sql.shuffle.partitions": str(4 * cores),
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",
        # Batch caches the deduplicated events once for every output; compressing the cache (Spark tries
        # each encoding on every column batch) was about a third of the CPU of filling it (3M records:
        # 22-24 s of CPU compressed, 16 s not), and what it saves, heap, this one-machine job has.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
