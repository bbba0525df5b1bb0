"""Files on whatever store the jobs read and write (local disk, HDFS, object storage), through Hadoop's
``FileSystem`` in Spark's JVM, as Spark itself reaches them.

The one module that uses PySpark's private handles to the JVM (``SparkContext._jvm``, ``._jsc``): Python's
own file functions only see local paths, and a job's paths are whatever URI the cluster's Hadoop
configuration resolves. Paths go in and come out as strings.
"""

from __future__ import annotations

from pyspark.sql import SparkSession


class HadoopFiles:
    """The file operations the jobs need, on the store of each path."""

    def __init__(self, spark: SparkSession) -> None:
        context = spark.sparkContext
        self._jvm = context._jvm
        self._conf = context._jsc.hadoopConfiguration()

    def _path(self, path: str):
        return self._jvm.org.apache.hadoop.fs.Path(str(path))

    def _fs(self, path):
        return path.getFileSystem(self._conf)

    def exists(self, path: str) -> bool:
        at = self._path(path)
        return bool(self._fs(at).exists(at))

    def children(self, path: str) -> list[str]:
        """The paths directly in the folder ``path`` (none if it does not exist)."""
        at = self._path(path)
        fs = self._fs(at)
        if not fs.exists(at):
            return []
        return [status.getPath().toString() for status in fs.listStatus(at)]

    def glob(self, pattern: str) -> list[str]:
        at = self._path(pattern)
        return [status.getPath().toString() for status in self._fs(at).globStatus(at) or []]

    def mkdirs(self, path: str) -> None:
        at = self._path(path)
        self._fs(at).mkdirs(at)

    def rename(self, source: str, target: str) -> None:
        at = self._path(source)
        self._fs(at).rename(at, self._path(target))

    def delete(self, path: str, recursive: bool = False) -> None:
        at = self._path(path)
        self._fs(at).delete(at, recursive)

    def read_text(self, path: str) -> str:
        at = self._path(path)
        stream = self._fs(at).open(at)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_text(self, path: str, text: str) -> None:
        """Create or replace ``path`` with ``text`` (UTF-8)."""
        at = self._path(path)
        stream = self._fs(at).create(at, True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()


def name_of(path: str) -> str:
    """The last component of a path or URI."""
    return str(path).rstrip("/").rpartition("/")[2]
