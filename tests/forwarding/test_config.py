"""The [forwarding] section: defaults, paths relative to the file, errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.config import ConfigError
from appliance.config.schema import parse_section
from appliance.forwarding.config import ForwardingConfig


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    raw = {"enabled": True, "manifest": "m.json", "upstream": {"host": "cloud", "ca_file": "/etc/ca.pem"}}
    config = parse_section(ForwardingConfig, raw, "forwarding", tmp_path)
    assert config.manifest == tmp_path / "m.json"
    assert config.upstream.host == "cloud" and config.upstream.port == 1883 and config.upstream.protocol == "5"
    assert config.upstream.ca_file == Path("/etc/ca.pem")
    assert config.max_store_bytes is None
    assert (config.upstream.format, config.upstream.batch_topic) == ("message", "gateways/{gateway_id}/batches")


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"upstream": {"port": 70000}}, "forwarding.upstream.port"),
        ({"upstream": {"protocol": "4"}}, "forwarding.upstream.protocol"),
        ({"upstream": {"topic_template": "x/{nope}"}}, "forwarding.upstream.topic_template"),
        ({"upstream": {"topic_template": "x/{device_id.real}"}}, "forwarding.upstream.topic_template"),
        ({"upstream": {"batch_topic": "x/{priority[0]:d}"}}, "forwarding.upstream.batch_topic"),
        ({"upstream": {"format": "batches"}}, "forwarding.upstream.format"),
        # A template the cloud must refuse makes every message unsendable: refused here, not dead-lettered.
        ({"upstream": {"topic_template": "gateways/#/{device_id}"}}, "forwarding.upstream.topic_template"),
        ({"upstream": {"topic_template": "gateways/+/{device_id}"}}, "forwarding.upstream.topic_template"),
        ({"upstream": {"topic_template": "gateways/\t/{device_id}"}}, "forwarding.upstream.topic_template"),
        ({"upstream": {"topic_template": ""}}, "forwarding.upstream.topic_template"),
        ({"upstream": {"batch_topic": "b/+/{priority}"}}, "forwarding.upstream.batch_topic"),
        ({"upstream": {"batch_topic": "b/\x7f"}}, "forwarding.upstream.batch_topic"),
        ({"upstream": {"client_id": "gw\n1"}}, "forwarding.upstream.client_id"),
        ({"upstream": {"username": "op\x00"}}, "forwarding.upstream.username"),
        ({"upstream": {"batch_topic": "gw/{device_id}"}}, "forwarding.upstream.batch_topic"),
        ({"upstream": {"batch_max_bytes": 10}}, "forwarding.upstream.batch_max_bytes"),
        ({"upstream": {"backoff_min_s": 5, "backoff_max_s": 1}}, "forwarding.upstream.backoff_max_s"),
        ({"upstream": {"hots": "x"}}, "forwarding.upstream.hots"),
        ({"max_store_bytes": 10}, "forwarding.max_store_bytes"),
        ({"metrics_port": 9100}, "forwarding.metrics_port"),  # the gateway's now: [gateway] metrics_port
        ({"manifest": 3}, "forwarding.manifest"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, raw: dict, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_section(ForwardingConfig, raw, "forwarding", tmp_path)
    assert info.value.path == path
