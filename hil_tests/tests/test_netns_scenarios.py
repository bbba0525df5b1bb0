"""The six scenarios again, on the netns bench: a kernel-shaped veth link instead of the userspace relay.

The userspace relay models TCP on a bad link; the netns bench puts the gateway's own TCP stack on one
(tbf queueing, real drops and retransmissions, SYN back-off after DOWN). A session has one bench
(``--bench``), so the default run starts a second pytest on `hil_tests/bench-netns.toml`: its scenarios,
summary table and failures are its own, and its timelines are kept in ``<this run>/netns/``. Afterwards
no namespace or host link of that run may be left, whatever happened in it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hil_tests.bench import DEFAULT_BENCH, BenchConfig
from hil_tests.netns_site import netns_refusal
from hil_tests.timeline import TimelineRun

REPO_ROOT = Path(__file__).resolve().parents[2]
NETNS_BENCH = REPO_ROOT / "hil_tests" / "bench-netns.toml"
SCENARIOS = REPO_ROOT / "hil_tests" / "scenarios"
SCENARIO_COUNT = 9  # six scenarios, the three forwarding ones in both upstream formats
RUN_TIMEOUT_S = 240


# `make test-slow`, not `make test`: the nested run doubles the HIL layer's time (~85 s), and its
# throughput-drop scenario in batch format is borderline against its 3 s alert bound on the kernel-shaped
# link (first alerts after RATE 9600: 2.8-3.9 s over eight runs, with tbf's old 12.6 s queue and with the
# 1 s one; the userspace bench stays under 2 s). The netns rig itself is tested in the default run
# (hil_tests/rig/tests/test_netns.py); the bound is re-measured under issue 16.
@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)  # the nested run's own limit; the suite's 120 s cut it short
def test_every_scenario_passes_on_the_netns_bench_and_leaves_nothing_behind(
    bench: BenchConfig, hil_run: TimelineRun, tmp_path: Path
) -> None:
    if bench.source != DEFAULT_BENCH:
        pytest.skip("runs only with the default bench: --bench already names the bench under test")
    refusal = netns_refusal()
    if refusal is not None:
        pytest.skip(refusal)
    artifacts = hil_run.folder / "netns"
    config = tmp_path / "bench-netns.toml"
    text = NETNS_BENCH.read_text().replace('dir = "../artifacts/hil"', f'dir = "{artifacts}"')
    config.write_text(text.replace('"../', f'"{REPO_ROOT}/'))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SCENARIOS), "--bench", str(config),
         "-k", "not satellite"],  # scenario 7's outages take minutes: run it on its own (docs/hil.md)
        cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert f"{SCENARIO_COUNT} passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-3000:]

    statuses = [
        record["detail"]["reply"]
        for path in artifacts.glob("*/*.jsonl")
        for record in map(json.loads, path.read_text().splitlines())
        if record["event"] == "rig" and record["detail"]["command"] == "STATUS"
    ]
    namespace_keys = ("gateway_ns=", "cloud_ns=")
    used = {word.split("=", 1)[1] for reply in statuses for word in reply.split() if word.startswith(namespace_keys)}
    assert len(used) == 2 * SCENARIO_COUNT, f"each scenario should have run on its own namespace pair: {sorted(used)}"
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not used & {line.split()[0] for line in left.splitlines() if line.strip()}, f"namespaces left: {left}"
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    run_ids = {name.split("-")[1] for name in used}
    assert not [line for line in links.splitlines() if any(f"hl{run_id}" in line for run_id in run_ids)], links
