"""The gateway's one Prometheus page, from a real ``appliance run``: the broker's and every service's
figures under one header each, read back by the reference parser; served with forwarding off too; the
run-state file that tells the tools where it is lives exactly as long as the gateway."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from appliance import run_state
from testing.processes import GatewayProcess


def test_one_page_for_the_broker_and_every_service_even_without_forwarding(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("[gateway]\nmetrics_port = 0\n")  # the embedded default's services: no forwarding
    gateway = GatewayProcess(tmp_path / "data", config=config).start()
    try:
        running = run_state.running(gateway.data_dir)
        assert running is not None and running.metrics_url is not None
        gateway.wait_for_log(rf"appliance ready: .*; metrics on {running.metrics_url}")
        with urllib.request.urlopen(running.metrics_url, timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = response.read().decode()
        names = [family.name for family in text_string_to_metric_families(text)]
        assert len(names) == len(set(names)), "a family was rendered twice"
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}
        assert samples[("appliance_store_healthy", (("store", "broker"),))] == 1
        assert samples[("appliance_store_healthy", (("store", "statestore"),))] == 1
        assert samples[("appliance_broker_messages_dropped_total", ())] == 0
        assert not any(name.startswith("appliance_forwarding_") for name, _ in samples)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(running.metrics_url.replace("/metrics", "/other"), timeout=5)
        assert info.value.code == 404
    finally:
        assert gateway.terminate() == 0
    assert run_state.running(gateway.data_dir) is None
    assert not (gateway.data_dir / run_state.FILE_NAME).exists()


def test_a_run_state_left_by_a_killed_gateway_names_no_running_gateway(tmp_path: Path) -> None:
    (tmp_path / run_state.FILE_NAME).write_text('{"pid": 999999999, "metrics_url": null}\n')
    assert run_state.running(tmp_path) is None
    (tmp_path / run_state.FILE_NAME).write_text("not json")
    assert run_state.running(tmp_path) is None
