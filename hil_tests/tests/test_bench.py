"""The bench configuration file, the ``--bench`` option and the ``rig`` fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hil_tests.bench import DEFAULT_BENCH, BenchConfigError, load_bench
from hil_tests.rig.launcher import REPO_ROOT
from hil_tests.timeline import read_timeline


def test_default_bench_is_the_local_simulated_one():
    config = load_bench()
    assert config.rig.local and config.rig.backend == "userspace"
    assert config.cloud.start and config.gateway.start
    assert config.devices.count == 20
    assert config.devices.micropython == REPO_ROOT / ".venv" / "bin" / "micropython"
    assert config.artifacts_dir == REPO_ROOT / "artifacts" / "hil"
    assert config.gateway.upstream_formats == ("message", "batch")


def test_upstream_formats_is_optional_and_defaults_to_the_message_format(tmp_path):
    text = DEFAULT_BENCH.read_text()
    path = tmp_path / "bench.toml"
    path.write_text(text.replace('upstream_formats = ["message", "batch"]', ""))
    assert load_bench(path).gateway.upstream_formats == ("message",)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ('backend = "userspace"', 'backend = "tc"', "rig.backend"),
        ("baud = 115200", 'baud = "fast"', "rig.baud"),
        ("count = 20", "count = -1", "devices.count"),
        ('serial = "pty"', "", "rig.serial"),
        ("# default the same) as the gateway reaches it through the rig.\nstart = true",
         "\nstart = false", "cloud.port"),
        ("[artifacts]", "[extra]\n[artifacts]", "extra"),
        ('upstream_formats = ["message", "batch"]', 'upstream_formats = ["message", "blob"]', "gateway.upstream_formats"),
        ('upstream_formats = ["message", "batch"]', "upstream_formats = []", "gateway.upstream_formats"),
        ('upstream_formats = ["message", "batch"]', 'upstream_formats = ["batch", "batch"]', "gateway.upstream_formats"),
        ('upstream_formats = ["message", "batch"]', 'upstream_formats = "batch"', "gateway.upstream_formats"),
        ('backend = "userspace"', 'backend = "bridge"', "rig.serial"),  # a bridge rig is a box, not a pty
        ("port = 0\n# The upstream", 'port = 0\nrun_in = "ip netns exec gw"\n# The upstream', "gateway.run_in"),
        ("port = 0\n# The upstream", 'port = 0\nrun_in = ["ip", ""]\n# The upstream', "gateway.run_in"),
        ("start = true\nhost = \"127.0.0.1\"\nport = 0\n\n[devices]",
         "start = true\nhost = \"127.0.0.1\"\nport = 0\nuplink_port = 70000\n\n[devices]", "cloud.uplink_port"),
        ("start = true\nhost = \"127.0.0.1\"\nport = 0\n\n[devices]",
         "start = true\nhost = \"127.0.0.1\"\nport = 0\nuplink_host = 7\n\n[devices]", "cloud.uplink_host"),
    ],
)  # fmt: skip
def test_errors_name_the_field(tmp_path, old, new, field):
    text = DEFAULT_BENCH.read_text()
    assert old in text
    path = tmp_path / "bench.toml"
    path.write_text(text.replace(old, new))
    with pytest.raises(BenchConfigError) as error:
        load_bench(path)
    assert error.value.path == field


def test_a_bench_file_describes_a_rig_box_a_gateway_command_and_the_cloud_as_the_gateway_sees_it(tmp_path):
    """A real bench: the rig's device, how to run the gateway where its uplink crosses the rig, and the cloud
    broker's address as the gateway reaches it (through the rig) beside the one the suite uses."""
    text = DEFAULT_BENCH.read_text().replace('serial = "pty"', 'serial = "/dev/hil-rig"')
    text = text.replace('backend = "userspace"', 'backend = "bridge"')
    text = text.replace("port = 0\n# The upstream", 'port = 1883\nrun_in = ["ip", "netns", "exec", "gw"]\n# The upstream')
    path = tmp_path / "bench.toml"
    path.write_text(text.replace("[cloud]\n", "[cloud]\nuplink_host = \"203.0.113.5\"\nuplink_port = 8883\n"))
    config = load_bench(path)
    assert not config.rig.local and config.rig.serial == "/dev/hil-rig" and config.rig.backend == "bridge"
    assert config.gateway.run_in == ("ip", "netns", "exec", "gw") and config.gateway.port == 1883
    assert config.cloud.uplink == ("203.0.113.5", 8883)
    assert load_bench().cloud.uplink == (load_bench().cloud.host, load_bench().cloud.port)  # by default the same
    assert load_bench().gateway.run_in == ()


def test_rig_fixture_gives_a_connected_client_that_logs_into_the_timeline(rig, timeline, bench):
    assert rig.rate(9600) == "RATE 9600"
    status = rig.status()
    assert status["backend"] == bench.rig.backend
    assert status["rate"] == "9600"
    commands = [r["detail"] for r in read_timeline(timeline.path) if r["event"] == "rig"]
    assert commands[0] == {"command": "RATE 9600", "reply": "OK RATE 9600"}
    assert commands[1]["command"] == "STATUS"


def test_bench_option_points_the_suite_at_another_bench(tmp_path):
    """A second bench file (netns backend, artifacts in tmp_path) drives the same fixture test."""
    if subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode != 0 or os.geteuid() != 0:
        pytest.skip("the netns bench needs root and ip netns")
    text = DEFAULT_BENCH.read_text().replace('backend = "userspace"', 'backend = "netns"')
    text = text.replace('dir = "../artifacts/hil"', f'dir = "{tmp_path / "artifacts"}"')
    text = text.replace('"../', f'"{REPO_ROOT}/')
    config = tmp_path / "netns-bench.toml"
    config.write_text(text)
    test_id = f"{Path(__file__).relative_to(REPO_ROOT)}::test_rig_fixture_gives_a_connected_client_that_logs_into_the_timeline"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_id, "--bench", str(config)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=100,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "HIL timelines" in result.stdout
    (timeline_file,) = (tmp_path / "artifacts").glob("*/*.jsonl")
    statuses = [r["detail"]["reply"] for r in map(json.loads, timeline_file.read_text().splitlines())]
    assert "backend=netns" in statuses[1]
