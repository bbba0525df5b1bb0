"""The batch job on a real Spark standalone cluster: a master and two workers started from the pip-installed
pyspark as on three hosts (``spark_cluster.py``), the project shipped as ``python -m pipeline package``
builds it (``--py-files pipeline.zip``), submitted with ``spark-submit --master spark://...``; every output
equals the local run's, row for row (floating-point columns to a relative 1e-12, see ``assert_same_rows``).

The cluster compacts the landing zone into a bronze table of its own before the outputs. The landing
zone, the bronze table and the outputs are folders of this machine, which every worker sees, as a shared
filesystem would be on three hosts. The executors' Python has the ``[pipeline]`` packages and not the
project (``dependencies_only_python``), so the job can only work with the code the zip carries.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.package import build_package
from tests.pipeline.pipeline_data import SAMPLE_LATENESS
from tests.pipeline.spark_cluster import StandaloneCluster, dependencies_only_python

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

FLOAT_TOLERANCE = 1e-12  # relative; a double has ~16 significant digits

# Tiny data, as in conftest.py's session: no adaptive planning, interpreted expressions and a C1-only JIT
# start faster than they lose; small heaps, the machine is shared. Nothing here changes what the job computes.
SUBMIT_OPTIONS = [
    "--driver-memory", "512m", "--executor-memory", "512m",
    "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
    "--conf", "spark.log.level=WARN",
    "--conf", "spark.sql.adaptive.enabled=false",
    "--conf", "spark.sql.codegen.wholeStage=false", "--conf", "spark.sql.codegen.factoryMode=NO_CODEGEN",
    "--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Master and workers starting (``wait_ready`` waits for them): their JVMs start while the test runs
    batch locally and builds the package."""
    pytest.importorskip("pyspark")
    cluster = StandaloneCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.stop()
    assert not left, f"processes of the cluster still running after it was stopped: {left}"


def table_rows(path: Path) -> list[dict]:
    """Every row of a Parquet output, ``date`` partitions included."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def assert_same_rows(got: list[dict], expected: list[dict], name: str) -> None:
    """Equal row for row; a float may differ in its last bits (``FLOAT_TOLERANCE``): an average sums its
    values in the order the partial aggregates meet, which the partitioning and the executors' timing
    decide. Everything else - counts, ids, windows, maxima, percentiles - is exact.

    Rows are paired by their values without the floats (every output has a key of such columns)."""
    def without_floats(row: dict) -> str:
        return json.dumps({k: v for k, v in row.items() if not isinstance(v, float)}, sort_keys=True, default=str)

    assert sorted(map(without_floats, got)) == sorted(map(without_floats, expected)), name
    pairs = zip(sorted(got, key=without_floats), sorted(expected, key=without_floats), strict=True)
    for cluster_row, local_row in pairs:
        for column, value in local_row.items():
            if isinstance(value, float):
                other = cluster_row[column]
                same = math.isclose(other, value, rel_tol=FLOAT_TOLERANCE) or (math.isnan(other) and math.isnan(value))
                assert same, f"{name}.{column}: cluster {other!r}, local {value!r} in {local_row}"


def test_batch_on_the_cluster_equals_the_local_run(cluster, batch_outputs, sample, tmp_path):
    local, local_counts = batch_outputs  # the local[2] run, in this process, while the workers start
    archive, launcher = build_package(tmp_path / "dist")
    python = dependencies_only_python(tmp_path / "worker-python")
    found = subprocess.run([python, "-c", "import pyarrow, pandas, pyspark; import pipeline"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert "No module named 'pipeline'" in found.stderr  # only the zip can bring it
    out = tmp_path / "cluster-out"
    waited = time.monotonic()
    state = cluster.wait_ready()
    assert state["aliveworkers"] == 2 and state["cores"] == 2
    submitted = time.monotonic()

    done = cluster.submit([
        "--py-files", str(archive), "--conf", f"spark.pyspark.python={python}", *SUBMIT_OPTIONS,
        str(launcher), "batch", "--landing", local.landing, "--bronze", str(tmp_path / "cluster-bronze"),
        "--out", str(out), "--hil", str(local.hil),
        "--lateness", SAMPLE_LATENESS, "--shuffle-partitions", "4",
    ])
    assert done.returncode == 0, done.stdout[-20000:]
    print(f"workers ready after {submitted - waited:.1f}s more, spark-submit took {time.monotonic() - submitted:.1f}s")

    landed = sum(1 for path in Path(local.landing).glob("*/date=*/hour=*/*.jsonl") for _ in path.open())
    assert f"[bronze] {landed} new landing lines" in done.stdout  # its own compaction, on the executors
    for name, count in local_counts.items():
        assert f"] {name}: {count} rows" in done.stdout
        assert_same_rows(table_rows(out / name), table_rows(Path(local.output(name))), name)
    assert sorted(path.name for path in out.iterdir()) == sorted(local_counts)

    apps = cluster.state()["completedapps"]
    assert [(app["name"], app["state"]) for app in apps] == [("pipeline-batch", "FINISHED")]
    for worker in ("worker1", "worker2"):  # both executors ran tasks, not one
        logs = list((cluster.work_dir / worker / "work").glob("app-*/*/stderr"))
        assert any("Running task" in log.read_text(errors="replace") for log in logs), worker
