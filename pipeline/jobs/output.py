"""Writing an output table so that it can always be read back, empty or not.

Spark writes nothing but ``_SUCCESS`` for an empty DataFrame partitioned by ``date``, and a reader that
infers the schema then fails (``UNABLE_TO_INFER_SCHEMA``) - a clean landing zone, with nothing in
quarantine, crashed ``batch`` that way. So an output with no rows at all gets one Parquet file with no
rows and the full schema (``date`` included, as a column) at its root, which Spark, pyarrow and DuckDB
all read as an empty table; the file goes as soon as the output has partitions. The jobs never read an
output back: its row count is counted on the way to the files.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

PARTITION = "date"


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
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(path)
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    children = [status.getPath() for status in fs.listStatus(root)]
    if any(child.getName().startswith(f"{PARTITION}=") for child in children):
        for child in children:
            if child.getName().startswith("part-"):  # the empty-schema file of an earlier run
                fs.delete(child, False)
        return
    frame.limit(0).coalesce(1).write.mode("overwrite").parquet(path)
