"""The batch job on a real Spark standalone cluster: a master and two workers started from the pip-installed
pyspark as on three hosts (``spark_cluster.py``), the project shipped as ``python -m pipeline package``
builds it (``--py-files pipeline.zip``), submitted with ``spark-submit --master spark://...``; every output
equals the local run's, row for row (floating-point columns to a relative 1e-12, see ``assert_same_rows``).

The cluster compacts the landing zone into a bronze table of its own before the outputs. The landing
zone, the bronze table and the outputs are folders of this machine, which every worker sees, as a shared
filesystem would be on three hosts. The executors' Python has the ``[pipeline]`` packages and not the
project (``dependencies_only_python``), so the job can only work with the code the zip carries.

The cluster starts, and the job runs, beside the other Spark tests of the run (``cluster_batch`` in
conftest.py): this test, the last of them, reads the outcome.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

FLOAT_TOLERANCE = 1e-12  # relative; a double has ~16 significant digits


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


def test_batch_on_the_cluster_equals_the_local_run(cluster_batch, batch_outputs, sample):
    local, local_counts = batch_outputs  # the local[2] run, in this process, on the table compacted from the sample
    submission = cluster_batch.result()  # started with the first Spark test, run beside the others
    assert "No module named 'pipeline'" in submission.import_attempt.stderr  # only the zip can bring it
    assert submission.ready_state["aliveworkers"] == 2 and submission.ready_state["cores"] == 2
    done, out = submission.done, submission.out
    assert done.returncode == 0, done.stdout[-20000:]
    print(f"workers ready after {submission.waited_s:.1f}s more, spark-submit took {submission.submit_s:.1f}s")

    landed = sum(1 for path in (sample / "landing").glob("*/date=*/hour=*/*.jsonl") for _ in path.open())
    assert f"[bronze] {landed} new landing lines" in done.stdout  # its own compaction, on the executors
    for name, count in local_counts.items():
        assert f"] {name}: {count} rows" in done.stdout
        assert_same_rows(table_rows(out / name), table_rows(Path(local.output(name))), name)
    assert sorted(path.name for path in out.iterdir()) == sorted(local_counts)

    apps = submission.done_state["completedapps"]
    assert [(app["name"], app["state"]) for app in apps] == [("pipeline-batch", "FINISHED")]
    for worker in ("worker1", "worker2"):  # both executors ran tasks, not one
        logs = list((cluster_batch.cluster.work_dir / worker / "work").glob("app-*/*/stderr"))
        assert any("Running task" in log.read_text(errors="replace") for log in logs), worker
    assert not submission.left_running, f"processes of the cluster still running after it was stopped: {submission.left_running}"
