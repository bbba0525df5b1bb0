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
        "spark.executorEnv.PYTHONWARNINGS": f"ignore:{_PANDAS_WARNING}:FutureWarning",
    }
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # what pyspark starts workers with
            settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions or 8)
            os.environ.setdefault("PYTHONWARNINGS", settings["spark.executorEnv.PYTHONWARNINGS"])
    if shuffle_partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
