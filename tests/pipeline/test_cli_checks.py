"""Usage errors of ``batch`` and ``stream`` are found before Spark starts (milliseconds, nothing done),
and a ranged batch says which receive dates it covered and which late data it could not see."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.jobs.settings import JobSettings, parse_duration_ms
from tests.pipeline.pipeline_data import MINUTE, T0, reading, write_batch

ROOT = Path(__file__).resolve().parents[2]

# pyspark made unimportable: a command that reaches Spark fails with ImportError instead of a usage error
NO_SPARK = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ImportError("Spark started: " + name)
sys.meta_path.insert(0, Blocked())
from pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_SPARK, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("argv", "message"), [
    (["batch", "--from", "2026-01-02", "--to", "2026-01-01"], "--to 2026-01-01 is before --from 2026-01-02"),
    (["batch", "--to", "2026-01-01"], "--to needs --from"),
    (["batch", "--window", "five minutes"], "not a duration: 'five minutes'"),
    (["batch", "--window", "0 minutes"], "--window must be longer than zero"),
    (["stream", "--checkpoint", "c", "--lateness", "10 fortnights"], "not a duration: '10 fortnights'"),
    (["stream", "--checkpoint", "c", "--lateness", "-1 minutes"], "not a duration"),
    (["batch", "--late-days", "-1"], "--late-days must not be negative"),
])
def test_usage_errors_come_before_spark(tmp_path, argv, message):
    started = time.monotonic()
    done = run_cli(argv[0], "--landing", str(tmp_path / "l"), "--out", str(tmp_path / "o"), *argv[1:])
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Spark started" not in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 20  # a Python start on a loaded machine; Spark's was 10 s on top
    assert not (tmp_path / "l").exists()  # nothing done: not even the landing folders made


def test_durations():
    assert parse_duration_ms("5 minutes") == 300_000
    assert parse_duration_ms("1 hour") == 3_600_000
    assert parse_duration_ms("1.5 seconds") == 1_500
    for bad in ("", "5", "minutes 5", "5 parsecs", "nan minutes", "inf hours", "5 minutes ago"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration_ms(bad)


def test_covered_says_what_a_ranged_run_reads_and_rewrites():
    assert JobSettings("l", "o").covered() == "receive dates: all; outputs: rewritten whole"
    ranged = JobSettings("l", "o", received_from="2026-01-04", late_days=1)
    assert ranged.covered() == ("receive dates read: 2026-01-02..2026-01-05; output dates rewritten: "
                                "2026-01-03..2026-01-04 (--late-days 1)")


@pytest.mark.slow  # two batch runs
def test_a_ranged_run_names_the_late_readings_it_cannot_count(spark, tmp_path):
    """A reading of 01-02 received on 01-04 (two days late): a full run counts it; ``--from 2026-01-02``
    reads receive dates up to 01-03 only, rewrites 01-02 without it, and says so."""
    from pipeline.jobs.batch import run_batch

    landing = tmp_path / "landing"
    day2 = 24 * 60
    on_time = [reading("gw1", "t1", n, day2 + n * 10, 20.0, 21.0, False) for n in range(1, 6)]
    late = reading("gw1", "t1", 99, day2 + 120, 22.0, 21.0, True, received_ms=T0 + (3 * day2 + 30) * MINUTE)
    write_batch(landing, [*on_time, late], 0)
    lines: list[str] = []
    run_batch(spark, JobSettings(str(landing), str(tmp_path / "out"), received_from="2026-01-02"), progress=lines.append)
    said = "\n".join(lines)
    assert "receive dates read: 2025-12-31..2026-01-03; output dates rewritten: 2026-01-01..2026-01-02" in said
    assert "late data not seen: 1 readings and 0 metrics samples received" in said
    assert "--late-days 2" in said
    lines.clear()
    run_batch(spark, JobSettings(str(landing), str(tmp_path / "out"), received_from="2026-01-02", late_days=2,
                                 compact=False), progress=lines.append)
    assert "late data not seen: none" in "\n".join(lines)
