"""Writing an output table so that it can always be read back, empty or not, and a run's outputs so that
they change together or not at all.

**One run, all outputs or none.** ``batch`` writes every output into a staging folder of its own
(``OUT/_staging-<run>/<name>``) and only when all are written moves them into place (``commit_outputs``):
otherwise a run that fails on its fourth output (a corrupt bronze file) would leave three outputs of the
new run beside the others of the old one. The move is a journal (``OUT/_commit.json``: what goes where) then
renames, each of a whole output (a full run) or of its rewritten ``date=`` partitions (a ranged one);
a run that dies among the renames leaves the journal, and the next run (``finish_commit``, also called by
the report) completes them before anything reads the outputs, so a reader after the next start sees one
run's outputs. Renames are cheap on a local or shared filesystem and HDFS; on object storage each is a
copy (see docs/pipeline.md).

Spark writes nothing but ``_SUCCESS`` for an empty DataFrame partitioned by ``date``, and a reader that
infers the schema then fails (``UNABLE_TO_INFER_SCHEMA``): a clean landing zone, with nothing in
quarantine, would crash ``batch``. So an output with no rows at all gets one Parquet file with no
rows and the full schema (``date`` included, as a column) at its root, which Spark, pyarrow and DuckDB
all read as an empty table; the file goes as soon as the output has partitions. The jobs never read an
output back: its row count is counted on the way to the files.
"""

from __future__ import annotations

import json
import time

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from pipeline.jobs.files import HadoopFiles, name_of

PARTITION = "date"
JOURNAL = "_commit.json"  # OUT/_commit.json: a run's outputs being moved into place (``commit_outputs``)
STAGING_PREFIX = "_staging-"


def write_output(spark: SparkSession, frame: DataFrame, path: str, dynamic: bool = False) -> int:
    """Overwrite ``path`` with ``frame`` (partitioned by ``date`` if it has one); returns the number of
    rows written, counted as they pass on their way to the files (an ``Observation``) rather than by
    reading the output again, which cost a job and a listing of every written file per output.

    ``dynamic``: replace only the ``date`` partitions ``frame`` has rows for and leave the others as they
    are, files and all (a batch over a date range)."""
    written = Observation()
    writer = frame.observe(written, F.count(F.lit(1)).alias("rows")).write.mode("overwrite")
    partitioned = PARTITION in frame.columns
    if partitioned:
        writer = writer.partitionBy(PARTITION).option("partitionOverwriteMode", "dynamic" if dynamic else "static")
    writer.parquet(path)
    if partitioned:
        _keep_schema_when_empty(spark, frame, path)
    return int(written.get["rows"])


def _keep_schema_when_empty(spark: SparkSession, frame: DataFrame, path: str) -> None:
    """Through Hadoop's FileSystem, so that it works on any store the job writes to. The zero-row file is
    ``frame`` limited to no row, which Spark plans as an empty relation in the JVM (``createDataFrame([])``
    would start Python workers to serialise nothing)."""
    files = HadoopFiles(spark)
    children = files.children(path)
    if any(name_of(child).startswith(f"{PARTITION}=") for child in children):
        for child in children:
            if name_of(child).startswith("part-"):  # the empty-schema file of an earlier run
                files.delete(child)
        return
    frame.limit(0).coalesce(1).write.mode("overwrite").parquet(path)


def staging_folder(out: str) -> str:
    return f"{out.rstrip('/')}/{STAGING_PREFIX}{int(time.time() * 1000)}"


WHOLE, PARTITIONS = "whole", "partitions"


def commit_outputs(spark: SparkSession, out: str, staging: str, outputs: dict[str, str]) -> None:
    """Move the staged outputs into ``out``, each by its mode: ``WHOLE`` replaces the old output,
    ``PARTITIONS`` (a ranged run's partitioned outputs) replaces each staged ``date=`` partition's namesake
    and keeps the others. The journal goes first."""
    HadoopFiles(spark).write_text(f"{out.rstrip('/')}/{JOURNAL}", json.dumps({"staging": staging, "outputs": outputs}))
    finish_commit(spark, out)


def finish_commit(spark: SparkSession, out: str) -> bool:
    """Complete the commit a journal in ``out`` describes (every step may already be done); True when
    there was one. Leftover staging folders of runs that failed before their commit are removed."""
    files = HadoopFiles(spark)
    root = out.rstrip("/")
    journal = f"{root}/{JOURNAL}"
    if not files.exists(root):
        return False
    if not files.exists(journal):
        for child in files.children(root):
            if name_of(child).startswith(STAGING_PREFIX):
                files.delete(child, recursive=True)
        return False
    plan = json.loads(files.read_text(journal))
    staging = plan["staging"]
    trash = f"{staging}-replaced"
    files.mkdirs(trash)
    for name, mode in plan["outputs"].items():
        staged, target = f"{staging}/{name}", f"{root}/{name}"
        if not files.exists(staged):
            continue  # moved already
        if mode == WHOLE:
            if files.exists(target):
                files.rename(target, f"{trash}/{name}")
            files.rename(staged, target)
            continue
        files.mkdirs(target)
        for child in files.children(staged):
            partition = name_of(child)
            if not partition.startswith(f"{PARTITION}="):
                continue
            old = f"{target}/{partition}"
            if files.exists(old):
                files.mkdirs(f"{trash}/{name}")
                files.rename(old, f"{trash}/{name}/{partition}")
            files.rename(child, old)
        kept = files.children(target)
        if any(name_of(child).startswith(f"{PARTITION}=") for child in kept):
            for child in kept:
                if name_of(child).startswith("part-"):  # an empty output's schema file
                    files.delete(child)
        files.delete(staged, recursive=True)
    files.delete(journal)
    files.delete(trash, recursive=True)
    files.delete(staging, recursive=True)
    return True
