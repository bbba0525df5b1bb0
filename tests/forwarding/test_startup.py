"""``appliance run`` with forwarding enabled refuses to start on a manifest that does not load (issue 24).

Before, it logged ``appliance ready``, answered every device PUBACK 0 and routed nothing: one ERROR line and
an ``error`` field in ``routes show`` were the only signs. A reload that fails keeps the running routes
(test_gateway_forwarding.py, ``rejected, keeping 1 running routes``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testing.processes import ROOT

ROUTE = "FROM /messages/* INTO $upstream"


def run(tmp_path: Path, manifest_text: str | None) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "gateway.toml"
    lines = ["[forwarding]", "enabled = true"]
    if manifest_text is not None:
        (tmp_path / "manifest.json").write_text(manifest_text)
        lines.append('manifest = "manifest.json"')
    config.write_text("\n".join(lines) + "\n")
    return subprocess.run(
        [sys.executable, "-m", "appliance", "run", "--config", str(config), "--data-dir", str(tmp_path / "data"),
         "--listen", "127.0.0.1:0"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )


@pytest.mark.parametrize(("text", "names"), [
    ('{"schemaVersion": "1.1.0",\n "routes": {"r": "' + ROUTE + '",}}', ["$:", "line 2 column"]),
    ('{"schemaVersion": "1.1.0", "routes": {"r": {"route": "' + ROUTE + '", "priority": 12}}}',
     ["$.routes.r.priority", "12 is greater than the maximum of 9"]),
    ('{"schemaVersion": "1.1.0", "routes": {"r": "FROM /messages/* WHERE a = INTO $upstream"}}',
     ["$.routes.r", "column 28"]),
])
def test_a_manifest_that_does_not_load_refuses_the_start(tmp_path: Path, text: str, names: list[str]) -> None:
    result = run(tmp_path, text)
    assert result.returncode == 1, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "appliance ready" not in output
    [line] = [line for line in output.splitlines() if "cannot start" in line]
    assert str(tmp_path / "manifest.json") in line
    for name in names:
        assert name in line, line


def test_a_missing_manifest_file_refuses_the_start(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[forwarding]\nenabled = true\nmanifest = "nowhere.json"\n')
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "run", "--config", str(config), "--data-dir", str(tmp_path / "data"),
         "--listen", "127.0.0.1:0"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "cannot start" in result.stdout and "nowhere.json" in result.stdout
