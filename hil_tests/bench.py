"""The bench configuration: one TOML file says where everything is, so the same suite runs on any bench.

`hil_tests/bench.toml` describes the local simulated bench (rig spawned on a pty pair, gateway, cloud
broker and thermostats started as local processes). A real bench gets its own file, passed with
``pytest --bench FILE``: the rig's serial device instead of ``pty``, and fixed endpoints with ``start =
false`` for whatever already runs there. Errors name the field (``rig.backend``) so a typo in a bench file
is found without reading a traceback; relative paths resolve against the file's folder.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.forwarding.config import FORMATS as UPSTREAM_FORMATS

DEFAULT_BENCH = Path(__file__).resolve().parent / "bench.toml"
BACKENDS = ("userspace", "netns", "bridge")
# Backends the suite can spawn on a pty itself; a bridge rig shapes a rig box's ports, so it is a device.
LOCAL_BACKENDS = ("userspace", "netns")


class BenchConfigError(ValueError):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass(frozen=True)
class RigConfig:
    # "pty": spawn the rig locally on a pty pair; anything else is the serial device of a real rig.
    serial: str
    # The backend a locally spawned rig uses; a real rig has its own (STATUS says which).
    backend: str
    baud: int

    @property
    def local(self) -> bool:
        return self.serial == "pty"


@dataclass(frozen=True)
class ProcessEndpoint:
    """A TCP endpoint; ``start`` means the suite starts the process itself (then port 0 = any free port)."""

    start: bool
    host: str
    port: int


@dataclass(frozen=True)
class GatewayUnderTest(ProcessEndpoint):
    """The gateway under test. ``upstream_formats``: the ``[forwarding.upstream] format`` values the
    forwarding scenarios run with, each once (docs/message-format.md); every other scenario uses the first."""

    upstream_formats: tuple[str, ...] = UPSTREAM_FORMATS[:1]
    # The command prefix that runs the gateway where its uplink goes through the rig, e.g.
    # ["ip", "netns", "exec", "gw"]; empty: on the machine that runs pytest (its uplink NIC cabled to the rig).
    run_in: tuple[str, ...] = ()


@dataclass(frozen=True)
class CloudConfig(ProcessEndpoint):
    """The cloud broker: ``host``/``port`` as the suite's collector reaches it (unshaped), ``uplink`` as the
    gateway reaches it through the rig; the same address unless the bench file says otherwise."""

    uplink_host: str = ""
    uplink_port: int = 0

    @property
    def uplink(self) -> tuple[str, int]:
        return self.uplink_host or self.host, self.uplink_port or self.port


@dataclass(frozen=True)
class DevicesConfig:
    count: int
    id_prefix: str
    # start: the suite runs the firmware in local `micropython` processes; otherwise they are real boards.
    start: bool
    micropython: Path
    firmware: Path


@dataclass(frozen=True)
class HistoryConfig:
    """Where the bench's runs are recorded (`hil_tests.history`) and under which name."""

    database: Path
    bench: str  # the bench's name in a lab's shared database
    trend_runs: int  # how many runs a trend plot shows


@dataclass(frozen=True)
class BenchConfig:
    source: Path
    rig: RigConfig
    gateway: GatewayUnderTest
    cloud: CloudConfig
    devices: DevicesConfig
    artifacts_dir: Path
    history: HistoryConfig


def load_bench(path: Path = DEFAULT_BENCH) -> BenchConfig:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise BenchConfigError(str(path), str(error)) from None
    base = path.resolve().parent
    rig = _table(data, "rig")
    devices = _table(data, "devices")
    artifacts = _table(data, "artifacts")
    backend = _get(rig, "rig", "backend", str)
    if backend not in BACKENDS:
        raise BenchConfigError("rig.backend", f"expected one of {', '.join(BACKENDS)}, got {backend!r}")
    config = BenchConfig(
        source=path.resolve(),
        rig=RigConfig(_get(rig, "rig", "serial", str), backend, _get(rig, "rig", "baud", int)),
        gateway=_gateway(data),
        cloud=_cloud(data),
        devices=DevicesConfig(
            count=_get(devices, "devices", "count", int),
            id_prefix=_get(devices, "devices", "id_prefix", str),
            start=_get(devices, "devices", "start", bool),
            micropython=_path(base, _get(devices, "devices", "micropython", str)),
            firmware=_path(base, _get(devices, "devices", "firmware", str)),
        ),
        artifacts_dir=_path(base, _get(artifacts, "artifacts", "dir", str)),
        history=_history(data, base, path),
    )
    if config.rig.local and backend not in LOCAL_BACKENDS:
        raise BenchConfigError(
            "rig.serial", f"a {backend} rig runs on a rig box: give its serial device (the suite spawns only "
            f"{', '.join(LOCAL_BACKENDS)} on a pty)",
        )
    if config.devices.count < 0:
        raise BenchConfigError("devices.count", "must not be negative")
    unknown = set(data) - {"rig", "gateway", "cloud", "devices", "artifacts", "history"}
    if unknown:
        raise BenchConfigError(sorted(unknown)[0], "unknown section")
    return config


def _history(data: dict[str, Any], base: Path, source: Path) -> HistoryConfig:
    """The optional ``[history]`` section: database (default ``<artifacts dir>/history.db``), bench name
    (default the bench file's name without ``.toml``), trend_runs (default 20)."""
    table = data.get("history", {})
    if not isinstance(table, dict):
        raise BenchConfigError("history", "expected a section")
    unknown = set(table) - {"database", "bench", "trend_runs"}
    if unknown:
        raise BenchConfigError(f"history.{sorted(unknown)[0]}", "unknown key")
    artifacts = _path(base, _get(_table(data, "artifacts"), "artifacts", "dir", str))
    database = _path(base, _get(table, "history", "database", str)) if "database" in table else artifacts / "history.db"
    bench = _get(table, "history", "bench", str) if "bench" in table else source.stem
    trend_runs = _get(table, "history", "trend_runs", int) if "trend_runs" in table else 20
    if trend_runs < 1 or not bench:
        raise BenchConfigError("history", "trend_runs must be at least 1 and bench must not be empty")
    return HistoryConfig(database, bench, trend_runs)


def _path(base: Path, value: str) -> Path:
    """``value`` relative to the bench file's folder, without ``..`` (and without following symlinks)."""
    return Path(os.path.normpath(base / value))


def _table(data: dict[str, Any], name: str) -> dict[str, Any]:
    table = data.get(name)
    if not isinstance(table, dict):
        raise BenchConfigError(name, "missing section")
    return table


def _get(table: dict[str, Any], section: str, key: str, kind: type) -> Any:
    path = f"{section}.{key}"
    if key not in table:
        raise BenchConfigError(path, "missing")
    value = table[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BenchConfigError(path, f"expected {kind.__name__}, got {value!r}")
    return value


def _gateway(data: dict[str, Any]) -> GatewayUnderTest:
    endpoint = _endpoint(data, "gateway")
    table = data["gateway"]
    formats = UPSTREAM_FORMATS[:1]  # optional: bench files from before the batch format
    if "upstream_formats" in table:
        formats = _get(table, "gateway", "upstream_formats", list)
        if not formats or not all(f in UPSTREAM_FORMATS for f in formats) or len(set(formats)) != len(formats):
            raise BenchConfigError(
                "gateway.upstream_formats", f"expected distinct values of {', '.join(UPSTREAM_FORMATS)}, got {formats!r}"
            )
    run_in: list[Any] = _get(table, "gateway", "run_in", list) if "run_in" in table else []
    if not all(isinstance(word, str) and word for word in run_in):
        raise BenchConfigError("gateway.run_in", f"expected a list of non-empty strings, got {run_in!r}")
    return GatewayUnderTest(endpoint.start, endpoint.host, endpoint.port, tuple(formats), tuple(run_in))


def _cloud(data: dict[str, Any]) -> CloudConfig:
    endpoint = _endpoint(data, "cloud")
    table = data["cloud"]
    uplink_host = _get(table, "cloud", "uplink_host", str) if "uplink_host" in table else ""
    uplink_port = _get(table, "cloud", "uplink_port", int) if "uplink_port" in table else 0
    if not 0 <= uplink_port <= 65535:
        raise BenchConfigError("cloud.uplink_port", f"expected 0..65535, got {uplink_port}")
    return CloudConfig(endpoint.start, endpoint.host, endpoint.port, uplink_host, uplink_port)


def _endpoint(data: dict[str, Any], section: str) -> ProcessEndpoint:
    table = _table(data, section)
    endpoint = ProcessEndpoint(
        start=_get(table, section, "start", bool),
        host=_get(table, section, "host", str),
        port=_get(table, section, "port", int),
    )
    if not 0 <= endpoint.port <= 65535:
        raise BenchConfigError(f"{section}.port", f"expected 0..65535, got {endpoint.port}")
    if endpoint.port == 0 and not endpoint.start:
        raise BenchConfigError(f"{section}.port", "port 0 (any free port) only works when the suite starts it")
    return endpoint
