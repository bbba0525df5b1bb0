"""Run thermostat firmware instances for tests: a config with fast timing and a simulated room."""

from __future__ import annotations

import json
from pathlib import Path

from images.firmware.deploy import NAME_MAX
from tests.device_firmware.micropython import FIRMWARE


def longest_name(prefix: str) -> str:
    """prefix padded to the longest thermostat name deploy.py accepts: the name is in strings kept for
    the whole run, so the heap bounds are checked with it (docs/firmware.md, Memory)."""
    return (prefix + "-" + "x" * NAME_MAX)[:NAME_MAX]


def thermostat_config(name: str, host: str, port: int, **overrides) -> dict:
    """A config with timing fast enough for tests; overrides replace whole sections. Everything else
    is the firmware's own default (device_firmware/config.py), so the defaults live in one place."""
    config = {
        "thermostat": name,
        "broker": {"host": host, "port": port, "keepalive": 10},
        "timing": {"control_ms": 100, "telemetry_ms": 300, "backoff_min_ms": 100,
                   "backoff_max_ms": 800, "request_timeout_ms": 1000},
        "state_file": "setpoint.json",
        # A slow room: the set point, not the room's drift, decides the heater during a test.
        "hardware": {"kind": "simulated", "room": {"start_c": 18.0, "heat_c_per_s": 0.01}},
    }
    config.update(overrides)
    return config


def start_thermostat(micropython, workdir: Path, config: dict, code_dir: Path = FIRMWARE, heap: str | None = None,
                     before: tuple[Path, ...] = ()):
    """Write config.json into workdir (the device's flash) and boot main there. before: directories
    searched ahead of the firmware (test stand-ins such as clock_shift/)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(config))
    return micropython(["-m", "main"], cwd=workdir, path=[*before, code_dir], heap=heap)
