"""The end-to-end setup: devices -> our gateway (real process) -> throttling relay -> mosquitto (the cloud)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from appliance import run_state
from hil_tests.rig.relay import RelayThread
from testing.collector import Collector
from testing.device import Device
from testing.processes import ROOT, GatewayProcess, MosquittoProcess
from testing.waiting import wait_until


def manifest(routes: dict[str, Any], global_ttl: int = 7200) -> str:
    return json.dumps(
        {"$edgeHub": {"properties.desired": {"schemaVersion": "1.1.0", "routes": routes,
                                             "storeAndForwardConfiguration": {"timeToLiveSecs": global_ttl}}}}
    )


#: The gateway's forwarding metrics document upstream (gateway id gw1).
METRICS_TOPIC = "gateways/gw1/metrics"


class ForwardingRig:
    def __init__(self, tmp_path: Path, routes: dict[str, Any], extra_forwarding: str = "", global_ttl: int = 7200,
                 extra_upstream: str = "", cloud_config: str = "") -> None:
        self.tmp = tmp_path
        self.stack = ExitStack()
        self.mosquitto = self.stack.enter_context(MosquittoProcess(tmp_path / "cloud", extra_config=cloud_config))
        self.relay = RelayThread(self.mosquitto.host, self.mosquitto.port)
        self.relay.start()
        self.stack.callback(self.relay.stop)
        self.manifest_path = tmp_path / "manifest.json"
        self.manifest_path.write_text(manifest(routes, global_ttl))
        self.config = tmp_path / "gateway.toml"
        self.config.write_text(
            f"""[gateway]
id = "gw1"
metrics_port = 0
[forwarding]
enabled = true
manifest = "manifest.json"
watch_interval_s = 0.2
cleanup_interval_s = 0.5
{extra_forwarding}
[forwarding.upstream]
host = "127.0.0.1"
port = {self.relay.port}
keepalive_s = 2
backoff_min_s = 0.05
backoff_max_s = 0.3
{extra_upstream}
"""
        )
        self.gateway = GatewayProcess(tmp_path / "data", config=self.config)
        self.stack.callback(self.gateway.kill9)
        self.gateway.start()
        self.cloud = Collector(self.mosquitto.host, self.mosquitto.port, "gateways/#", aside=frozenset({METRICS_TOPIC}))
        self.stack.callback(self.cloud.close)

    def wait_for_log_count(self, pattern: str, count: int, timeout: float = 10.0) -> None:
        """Until ``count`` log lines match: for events that also happened at startup (a routes load)."""
        regex = re.compile(pattern)
        wait_until(lambda: sum(1 for line in self.gateway.output().splitlines() if regex.search(line)) >= count,
                   timeout, lambda: f"{count} log lines matching {pattern!r}:\n{self.gateway.output()}")

    def wait_for_log_total(self, pattern: str, total: int, timeout: float = 15.0) -> None:
        """Until the numbers captured by ``pattern`` over all log lines add up to ``total``."""
        regex = re.compile(pattern)
        wait_until(lambda: sum(int(m.group(1)) for line in self.gateway.output().splitlines()
                               if (m := regex.search(line))) >= total,
                   timeout, lambda: f"{pattern!r} adding up to {total}:\n{self.gateway.output()}")

    def device(self, device_id: str, protocol: int = 5) -> Device:
        """A paho device over MQTT 5 (``protocol`` 5) or 3.1.1 (4)."""
        device = Device(self.gateway.host, self.gateway.port, device_id, protocol)
        self.stack.callback(device.close)
        return device

    def status(self) -> dict[str, Any]:
        return json.loads((self.gateway.data_dir / "forwarding-routes.json").read_text())

    def metrics_url(self) -> str:
        running = run_state.running(self.gateway.data_dir)
        assert running is not None and running.metrics_url is not None
        return running.metrics_url

    def metrics_document(self, condition: Callable[[dict[str, Any]], bool], timeout: float = 15.0) -> dict[str, Any]:
        """The first forwarding metrics document (``gateways/gw1/metrics``, sent every
        ``metrics_interval_s``: set it short) that satisfies ``condition``."""

        def documents() -> list[dict[str, Any]]:
            return [json.loads(m.payload) for m in list(self.cloud.set_aside)]

        self.cloud.wait_until(lambda: any(condition(d) for d in documents()), timeout,
                              lambda: f"no metrics document as expected among {documents()[-3:]}")
        return next(d for d in documents() if condition(d))

    def prometheus(self) -> str:
        with urllib.request.urlopen(self.metrics_url(), timeout=5) as response:
            return response.read().decode()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "appliance", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)

    def close(self) -> None:
        self.stack.close()
