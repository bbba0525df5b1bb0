"""Runs the MicroPython unit tests in tests/device_firmware/mp/ under the real interpreter.

Each `mp/test_*.py` module runs once in `micropython` (mp/runner.py prints PASS/FAIL per
function); every MicroPython test function becomes one pytest test here.
"""

import re
import subprocess
from pathlib import Path

import pytest

from tests.device_firmware.micropython import FIRMWARE, MICROPYTHON, MP_TESTS

MODULES = sorted(p.stem for p in MP_TESTS.glob("test_*.py"))
CASES = [(module, name) for module in MODULES
         for name in re.findall(r"^def (test_\w+)", (MP_TESTS / f"{module}.py").read_text(), re.M)]
_results: dict[str, str] = {}


def micropython_output(script: Path, *args: str) -> str:
    """What ``micropython SCRIPT ARGS`` printed, stdout then stderr. Bytes that are not UTF-8 - a hostile
    value the firmware echoes, as test_ota's random values can be - are read escaped, not fatal: a strict
    decode failed the whole module's tests after every one of them had passed."""
    env = {"MICROPYPATH": f"{FIRMWARE}:{MP_TESTS}"}
    proc = subprocess.run([str(MICROPYTHON), str(script), *args], capture_output=True, text=True,
                          errors="backslashreplace", timeout=60, env=env)
    return proc.stdout + proc.stderr


def run_module(module: str) -> str:
    if module not in _results:
        _results[module] = micropython_output(MP_TESTS / "runner.py", module)
    return _results[module]


@pytest.mark.parametrize("module,name", CASES, ids=[f"{m}::{n}" for m, n in CASES])
def test_micropython(module: str, name: str) -> None:
    output = run_module(module)
    assert "DONE" in output, output
    assert re.search(rf"^PASS {name}$", output, re.M), output


def test_output_that_is_not_utf8_is_read_escaped(tmp_path: Path) -> None:
    script = tmp_path / "echo_bytes.py"
    script.write_text("import sys\nsys.stdout.buffer.write(b'value \\xe0 echoed\\n')\n")
    assert micropython_output(script) == "value \\xe0 echoed\n"
