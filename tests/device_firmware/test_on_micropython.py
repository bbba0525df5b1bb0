"""Runs the MicroPython unit tests in tests/device_firmware/mp/ under the real interpreter.

Each `mp/test_*.py` module runs once in `micropython` (mp/runner.py prints PASS/FAIL per
function); every MicroPython test function becomes one pytest test here.
"""

import re
import subprocess

import pytest

from tests.device_firmware.micropython import FIRMWARE, MICROPYTHON, MP_TESTS

MODULES = sorted(p.stem for p in MP_TESTS.glob("test_*.py"))
CASES = [(module, name) for module in MODULES
         for name in re.findall(r"^def (test_\w+)", (MP_TESTS / f"{module}.py").read_text(), re.M)]
_results: dict[str, str] = {}


def run_module(module: str) -> str:
    if module not in _results:
        env = {"MICROPYPATH": f"{FIRMWARE}:{MP_TESTS}"}
        proc = subprocess.run([str(MICROPYTHON), str(MP_TESTS / "runner.py"), module],
                              capture_output=True, text=True, timeout=60, env=env)
        _results[module] = proc.stdout + proc.stderr
    return _results[module]


@pytest.mark.parametrize("module,name", CASES, ids=[f"{m}::{n}" for m, n in CASES])
def test_micropython(module: str, name: str) -> None:
    output = run_module(module)
    assert "DONE" in output, output
    assert re.search(rf"^PASS {name}$", output, re.M), output
