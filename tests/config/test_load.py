"""The configuration loader: embedded default, overrides, and errors that name the field path."""

from pathlib import Path

import pytest

from appliance.cli import main
from appliance.config import ConfigError
from appliance.gateway_config import load_config


def test_embedded_default_listens_on_loopback_with_data_under_var(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config()
    assert [(listener.host, listener.port) for listener in config.broker.listeners] == [("127.0.0.1", 1883)]
    assert config.data_dir == tmp_path / "var"
    assert config.broker.auth.allow_anonymous is True


def test_overrides_replace_listeners_and_data_dir(tmp_path):
    config = load_config(
        None,
        {"broker": {"listeners": [{"type": "tcp", "host": "127.0.0.1", "port": 2883}]}, "gateway": {"data_dir": str(tmp_path)}},
    )
    assert config.broker.listeners[0].port == 2883
    assert config.data_dir == tmp_path


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    file = tmp_path / "gw.toml"
    file.write_text('[gateway]\ndata_dir = "state"\n[broker.auth]\npassword_file = "passwd"\n')
    config = load_config(file)
    assert config.data_dir == tmp_path / "state"
    assert config.broker.auth.password_file == tmp_path / "passwd"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("[[broker.listeners]]\nport = 70000\n", "broker.listeners[0].port"),
        ("[[broker.listeners]]\nport = 1883\n[[broker.listeners]]\ntype = 'udp'\n", "broker.listeners[1].type"),
        ("[gateway]\nlog_levle = 'info'\n", "gateway.log_levle"),
        ("[broker.auth]\nallow_anonymous = 'yes'\n", "broker.auth.allow_anonymous"),
        ("[[broker.listeners]]\ntype = 'tls'\n", "broker.listeners[0].certfile"),
        ("[broker.limits]\nmax_topic_levels = 0\n", "broker.limits.max_topic_levels"),
        ("[broker.limits]\nmax_user_properties = 'many'\n", "broker.limits.max_user_properties"),
        ("[broker.limits]\nmax_queued_bytes = -1\n", "broker.limits.max_queued_bytes"),
        ("[broker.limits]\nmax_queued_bytes = '1G'\n", "broker.limits.max_queued_bytes"),
    ],
)
def test_bad_field_is_reported_with_its_path(tmp_path, text, path):
    file = tmp_path / "gw.toml"
    file.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    assert caught.value.path == path


def test_check_config_cli_reports_error_and_exit_code(tmp_path, capsys):
    file = tmp_path / "gw.json"
    file.write_text('{"broker": {"listeners": "nope"}}')
    assert main(["check-config", "--config", str(file)]) == 2
    assert "broker.listeners" in capsys.readouterr().err


def test_check_config_cli_prints_the_resolved_config(tmp_path, capsys):
    assert main(["check-config", "--listen", "127.0.0.1:2999", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert '"port": 2999' in out
    assert str(Path(tmp_path)) in out


def test_a_relative_data_dir_on_the_command_line_is_taken_from_the_current_directory(tmp_path, monkeypatch, capsys):
    """Not from the config file's folder: a path typed on a command line means where the user stands."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "gateway.toml").write_text('[gateway]\ndata_dir = "from-file"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["check-config", "--config", str(etc / "gateway.toml"), "--data-dir", "typed"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "typed") in out and "from-file" not in out


def test_topic_depth_and_user_property_limits_default_and_parse(tmp_path):
    file = tmp_path / "gw.toml"
    file.write_text("[broker.limits]\nmax_topic_levels = 16000\n")
    limits = load_config(file).broker.limits
    assert (limits.max_topic_levels, limits.max_user_properties) == (16000, 64)


def test_max_queued_bytes_is_unset_by_default_and_taken_as_written(tmp_path):
    """Unset, the gateway works it out from the free disk at start (``gateway.resolve_queued_bytes``)."""
    file = tmp_path / "gw.toml"
    file.write_text("[broker.limits]\nmax_queued_bytes = 0\n")
    assert load_config(file).broker.limits.max_queued_bytes == 0
    file.write_text("")
    assert load_config(file).broker.limits.max_queued_bytes is None
