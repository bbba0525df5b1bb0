"""Fixtures for the pipeline tests: one Spark session for the whole run, and a real mosquitto broker.

Spark starts once per pytest session (a JVM start costs seconds on this machine): ``local[2]``, two
shuffle partitions, no UI, UTC. Tests that need it take the ``spark`` fixture; the others never start it.
The data is tiny, so the session trades peak speed for start-up: expressions are interpreted rather than
compiled (codegen is most of a small query's time); its Java options are ``jvm.py``'s.
"""

from __future__ import annotations

import os
import shutil

import pytest

from testing.processes import MosquittoProcess
from tests.pipeline.jvm import TEST_JAVA_OPTIONS


def _compare_spark_frames_without_pandas_on_spark() -> None:
    """``pyspark.testing.assertDataFrameEqual`` imports ``pyspark.pandas`` (and its test utilities) on every
    call, only to ask whether its arguments are pandas-on-Spark frames. pyspark 4.3's ``pyspark.pandas``
    does not import on pandas 3 (``DateOffset`` and ``infer_dtype_from_object`` moved or went), so every
    call failed with an ImportError before comparing anything. The pipeline tests compare Spark
    DataFrames only: when the real module cannot be imported, a stand-in whose ``DataFrame`` nothing is an
    instance of lets the function take its Spark path. Remove once pyspark supports pandas 3."""
    import sys
    import types

    try:
        import pyspark.pandas  # noqa: F401
        import pyspark.testing.pandasutils  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("pyspark.pandas")
        stand_in.DataFrame = type("DataFrame", (), {})  # type: ignore[attr-defined]
        utilities = types.ModuleType("pyspark.testing.pandasutils")
        utilities.PandasOnSparkTestUtils = type("PandasOnSparkTestUtils", (), {})  # type: ignore[attr-defined]
        sys.modules["pyspark.pandas"], sys.modules["pyspark.testing.pandasutils"] = stand_in, utilities


def pytest_configure(config):
    # pyspark 4.x on pandas 3: a support warning on every import and deprecation notes from inside pyspark.
    config.addinivalue_line("filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore:The copy keyword is deprecated")


#: The timeout of a test that uses Spark, start-up included. The first one starts the JVM and runs the batch
#: job over the sample (``batch_outputs``); on a loaded machine (load 14 on 2 cores) that alone passed the
#: suite's 120 s. A timeout raised inside a py4j call leaves its answer to be read by the next call, so
#: every later test of the process failed on the shared session: the bound is set for the slow case.
SPARK_TEST_TIMEOUT_S = 600


def pytest_collection_modifyitems(items):
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT_S))
    # The cluster test reads the outcome of a job that runs beside the other Spark tests (``cluster_batch``):
    # last of them, it finds it done. (The root conftest has put each test in its worker group already.)
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)


@pytest.fixture(scope="session")
def spark(request):
    pytest.importorskip("pyspark")  # appliance-pipeline (pipeline/pyproject.toml)
    if any(item.get_closest_marker("cluster") for item in request.session.items):
        # Selected, so it runs in this process (its test takes ``spark`` too): the cluster's JVMs start
        # and the job runs while the tests before it keep this session busy.
        request.getfixturevalue("cluster_batch")
    _compare_spark_frames_without_pandas_on_spark()
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pipeline.spark import session

    spark = session(
        "local[2]",
        "pipeline-tests",
        shuffle_partitions=2,
        conf={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.adaptive.enabled": "false",  # tiny data: planning costs more than it saves
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
            # A folder of more than 32 subfolders (a landing zone of many hours) is listed by a Spark job
            # of a task per subfolder, over a single JVM's threads here: CPU for nothing next to listing them in
            # the driver (a 400-file compaction: 3 CPU-s instead of 10). Which files are found is the same.
            "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
            "spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS,
            "spark.driver.memory": "1g",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()


@pytest.fixture(scope="session")
def sample(tmp_path_factory):
    """The sample landing zone (all batches) and HIL timelines, written once."""
    from tests.pipeline.pipeline_data import write_hil, write_sample

    root = tmp_path_factory.mktemp("sample")
    write_sample(root / "landing")
    write_hil(root / "hil")
    return root


@pytest.fixture(scope="session")
def cluster_batch(sample, tmp_path_factory):
    """The batch job over the sample on a standalone cluster (``spark_cluster.BatchOnCluster``), started
    by the first Spark test of a run that selected ``test_cluster.py``; the test waits for its outcome."""
    from tests.pipeline.pipeline_data import SAMPLE_LATENESS
    from tests.pipeline.spark_cluster import BatchOnCluster

    run = BatchOnCluster(tmp_path_factory.mktemp("cluster"), str(sample / "landing"), str(sample / "hil"),
                         SAMPLE_LATENESS).start()
    try:
        yield run
    finally:
        left = run.stop()
    assert not left, f"processes of the cluster still running after it was stopped: {left}"


@pytest.fixture(scope="session")
def batch_outputs(spark, sample, tmp_path_factory):
    """The batch job run once over the sample: its settings (output folder) and row counts.

    The run reads the sample through the bronze table only: the sample's landing files are compacted into
    the table first, and the job is given a landing zone with no file in it (what a job reading the JSON
    would find: nothing). test_bronze holds its rows to DuckDB's computation over the landing files; the
    cluster test (which compacts the landing files itself) holds every output to them, row for row."""
    from pipeline.jobs import bronze
    from pipeline.jobs.batch import run_batch
    from pipeline.jobs.settings import JobSettings
    from tests.pipeline.pipeline_data import SAMPLE_LATENESS

    table = tmp_path_factory.mktemp("sample-bronze")
    bronze.compact(spark, str(sample / "landing"), str(table))
    settings = JobSettings(str(tmp_path_factory.mktemp("landing-with-no-file")), str(sample / "batch"),
                           lateness=SAMPLE_LATENESS, hil=str(sample / "hil"), bronze=str(table))
    counts = run_batch(spark, settings, progress=lambda _: None)
    return settings, counts


@pytest.fixture
def mosquitto(tmp_path):
    """A real mosquitto on an OS-chosen free port (testing/processes.py); yields (host, port)."""
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed (make test installs it)")
    with MosquittoProcess(tmp_path / "mosquitto") as broker:
        yield broker.host, broker.port
