"""The Spark side imports nothing MQTT: a driver or executor runs without paho-mqtt (and without
``appliance``, which spark-submit does not ship). And this folder's test modules import neither Spark nor
the data libraries until a test runs: every ``make test`` worker collects them."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BLOCKED_IMPORT = """
import importlib, importlib.abc, pkgutil, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("paho", "appliance"):
            raise ImportError(f"{name} is blocked")

sys.meta_path.insert(0, Blocked())
import pipeline.jobs
for module in pkgutil.iter_modules(pipeline.jobs.__path__):
    importlib.import_module(f"pipeline.jobs.{module.name}")
import pipeline.report, pipeline.spark, pipeline.landing
from pipeline.cli import build_parser
build_parser().parse_args(["batch", "--landing", "x", "--out", "y"])
print("ok")
"""


def test_the_jobs_and_the_batch_command_import_without_paho():
    pytest.importorskip("pyspark")
    done = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_blocker_blocks():
    code = BLOCKED_IMPORT.replace("import pipeline.jobs\n", "import pipeline.envelope\nimport pipeline.jobs\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "paho is blocked" in done.stderr


#: What collecting this folder may not import: every `make test` worker collects it and runs none of its Spark
#: tests (`make test-spark`), and these libraries cost ~0.9 CPU-s a process (bench/RESULTS-suite.md, session 16).
#: The tests and helpers import them where they use them.
NOT_AT_COLLECTION = ("pandas", "pyarrow", "duckdb", "matplotlib", "numpy", "pyspark")

IMPORT_THE_FOLDER = """
import importlib, pathlib, sys
for path in sorted(pathlib.Path("tests/pipeline").glob("*.py")):
    if path.stem != "__init__":
        importlib.import_module(f"tests.pipeline.{path.stem}")
print(" ".join(sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[1:]))))
"""


def test_collecting_the_pipeline_tests_imports_no_spark_pandas_arrow_duckdb_or_matplotlib():
    done = subprocess.run([sys.executable, "-c", IMPORT_THE_FOLDER, *NOT_AT_COLLECTION], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
