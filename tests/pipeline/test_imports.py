"""The Spark side imports nothing MQTT: a driver or executor runs without paho-mqtt (and without
``appliance``, which spark-submit does not ship)."""

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
