"""The batch job on a real Spark standalone cluster: a master and two workers started from the pip-installed
pyspark as on three hosts (``spark_cluster.py``), the project shipped as ``python -m pipeline package``
builds it (``--py-files pipeline.zip``), submitted with ``spark-submit --master spark://...``; every output
equals the local run's, row for row.

The landing zone and the outputs are folders of this machine, which every worker sees, as a shared
filesystem would be on three hosts. The executors' Python has the ``[pipeline]`` packages and not the
project (``dependencies_only_python``), so the job can only work with the code the zip carries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.package import build_package
from tests.pipeline.pipeline_data import SAMPLE_LATENESS
from tests.pipeline.spark_cluster import StandaloneCluster, dependencies_only_python

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

# Tiny data, as in conftest.py's session: interpreted expressions and a C1-only JIT start faster than
# they lose; small heaps, the machine is shared. Nothing here changes what the job computes.
SUBMIT_OPTIONS = [
    "--driver-memory", "512m", "--executor-memory", "512m",
    "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
    "--conf", "spark.log.level=WARN",
    "--conf", "spark.sql.codegen.wholeStage=false", "--conf", "spark.sql.codegen.factoryMode=NO_CODEGEN",
    "--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Master bound, workers starting (``wait_ready`` waits for them): the workers' start overlaps with
    whatever the test does first."""
    pytest.importorskip("pyspark")
    cluster = StandaloneCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start_master()
        cluster.start_workers()
        yield cluster
    finally:
        left = cluster.stop()
    assert not left, f"processes of the cluster still running after it was stopped: {left}"


def table_rows(path: Path) -> list[str]:
    """Every row of a Parquet output (``date`` partitions included), as sorted canonical JSON."""
    import pyarrow.parquet as pq

    return sorted(json.dumps(row, sort_keys=True, default=str) for row in pq.read_table(path).to_pylist())


def test_batch_on_the_cluster_equals_the_local_run(cluster, batch_outputs, sample, tmp_path):
    local, local_counts = batch_outputs  # the local[2] run, in this process, while the workers start
    archive, launcher = build_package(tmp_path / "dist")
    python = dependencies_only_python(tmp_path / "worker-python")
    out = tmp_path / "cluster-out"
    state = cluster.wait_ready()
    assert state["aliveworkers"] == 2 and state["cores"] == 2

    done = cluster.submit([
        "--py-files", str(archive), "--conf", f"spark.pyspark.python={python}", *SUBMIT_OPTIONS,
        str(launcher), "batch", "--landing", local.landing, "--out", str(out), "--hil", str(local.hil),
        "--lateness", SAMPLE_LATENESS, "--shuffle-partitions", "4",
    ])
    assert done.returncode == 0, done.stdout[-20000:]

    for name, count in local_counts.items():
        assert f"] {name}: {count} rows" in done.stdout
        assert table_rows(out / name) == table_rows(Path(local.output(name))), name
    assert sorted(path.name for path in out.iterdir()) == sorted(local_counts)

    apps = cluster.state()["completedapps"]
    assert [(app["name"], app["state"]) for app in apps] == [("pipeline-batch", "FINISHED")]
    for worker in ("worker1", "worker2"):  # both executors ran tasks, not one
        logs = list((cluster.work_dir / worker / "work").glob("app-*/*/stderr"))
        assert any("Running task" in log.read_text(errors="replace") for log in logs), worker
