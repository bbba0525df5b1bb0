"""Smoke test of the broker benchmarks: their quick modes run end to end against both brokers.

Not a performance test (the figures depend on what else the machine runs): it checks that the load
generator connects, publishes, subscribes and acknowledges against our gateway and mosquitto, that every
figure is positive, and that the report has its ratio rows. QoS 1 and the connection storm cover all three
worker roles; the run is bounded well under 30 s.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from testing.processes import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs Debian's mosquitto"),
]

SCENARIOS = "connections,qos1"
EXPECTED_ROWS = ("QoS 1 4->1 window 64, msgs/s", "200 connections: seconds to connect", "200 connections: broker RSS, MB")


def table_rows(output: str) -> dict[str, list[str]]:
    """The report's Markdown table, by metric label: [ours, mosquitto, ratio, target]."""
    rows = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] != "metric":
            rows[cells[0]] = cells[1:]
    return rows


def number(cell: str) -> float:
    return float(cell.split(" (")[0].replace(",", ""))


def test_quick_bench_reports_positive_figures_and_ratios() -> None:
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "bench/broker.py", "--quick", "--only", SCENARIOS, "--duration", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert time.monotonic() - started < 30
    rows = table_rows(completed.stdout)
    for label in EXPECTED_ROWS:
        assert label in rows, output
        ours, mosquitto, ratio, _target = rows[label]
        assert number(ours) > 0 and number(mosquitto) > 0, output
        assert float(ratio) > 0, output


def test_idle_connections_bench_reports_both_brokers_and_the_ratio() -> None:
    completed = subprocess.run(
        [sys.executable, "bench/idle_connections.py", "--counts", "100", "--rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    [row] = [line for line in completed.stdout.splitlines() if line.startswith("| 100 |")]
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    ours, mosquitto, ratio = number(cells[1]), number(cells[2]), float(cells[3])
    assert ours > 0 and mosquitto > 0 and ratio > 0, output
