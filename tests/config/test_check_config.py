"""``appliance check-config`` checks every file a configuration names and reports every error in one run.

Before: it exited 0 for a missing certificate, a missing password file, a bad ACL line and an invalid
manifest (all of which ``run`` then refuses or ignores), and stopped at the first bad setting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.broker.security.acl import Acl
from appliance.broker.security.auth import hash_password
from appliance.cli import main
from appliance.config_check import check_config
from testing.campaigns import campaign
from testing.certificates import valid_for

GOOD_MANIFEST = {"schemaVersion": "1.2", "routes": {"all": "FROM /messages/* INTO $upstream"}}


def write_config(directory: Path, text: str) -> Path:
    path = directory / "gateway.toml"
    path.write_text(text)
    return path


def good_files(directory: Path) -> str:
    cert, key = valid_for(directory, "server", 365)
    (directory / "passwd").write_text(f"alice:{hash_password('pw', iterations=1).encode()}\n")
    (directory / "acl").write_text("user alice\ntopic readwrite devices/#\n")
    (directory / "manifest.json").write_text(json.dumps(GOOD_MANIFEST))
    return f"""
[[broker.listeners]]
type = "tls"
port = 8883
certfile = "{cert.name}"
keyfile = "{key.name}"
cafile = "{cert.name}"
[broker.auth]
allow_anonymous = false
password_file = "passwd"
acl_file = "acl"
[forwarding]
enabled = true
manifest = "manifest.json"
[forwarding.upstream]
host = "cloud.example"
tls = true
ca_file = "{cert.name}"
cert_file = "{cert.name}"
key_file = "{key.name}"
"""


def test_a_config_whose_files_are_all_right_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, good_files(tmp_path))
    config, problems = check_config(path)
    assert problems == [] and config is not None
    assert main(["check-config", "--config", str(path)]) == 0
    assert '"acl_file"' in capsys.readouterr().out


def test_every_broken_file_is_reported_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = good_files(tmp_path)
    (tmp_path / "server.pem").rename(tmp_path / "moved.pem")  # the certificate, CA and client cert are gone
    (tmp_path / "passwd").unlink()
    (tmp_path / "acl").write_text("user alice\ntopic readwrite devices/#\ntopik read x\ntopic sometimes y\n")
    (tmp_path / "manifest.json").write_text(json.dumps({"schemaVersion": "1.2", "routes": {
        "a": "FROM /messages/* INTO $nowhere", "b": {"route": "FROM /messages/* WHERE x = INTO $upstream", "priority": 12}}}))
    path = write_config(tmp_path, text)
    config, problems = check_config(path)
    assert config is None
    text_of = "\n".join(problems)
    for expected in (
        "broker.listeners[0].certfile: ", "server.pem does not exist",
        "broker.listeners[0].cafile: ",
        "broker.auth.password_file: cannot read the password file",
        "acl:3: expected 'user', 'topic' or 'pattern', got 'topik'",
        "acl:4: access must be read, write, readwrite or deny, got 'sometimes'",
        "forwarding.manifest: ", "$.routes.a", "$.routes.b.priority", "$.routes.b.route",
        "forwarding.upstream.cert_file: ", "forwarding.upstream.ca_file: ",
    ):
        assert expected in text_of, (expected, problems)
    assert main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{len(problems)} configuration error(s)" in err and "topik" in err and "$nowhere" in err


def test_a_key_that_does_not_belong_to_the_certificate(tmp_path: Path) -> None:
    cert, _ = valid_for(tmp_path, "one", 365)
    _, other_key = valid_for(tmp_path, "two", 365)
    path = write_config(tmp_path, f'[[broker.listeners]]\ntype = "tls"\ncertfile = "{cert.name}"\nkeyfile = "{other_key.name}"\n')
    _, problems = check_config(path)
    assert problems == [f"broker.listeners[0].certfile: {cert} with {other_key}: the key does not belong to the certificate"]


def test_a_file_that_is_not_pem(tmp_path: Path) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    path = write_config(tmp_path, '[forwarding.upstream]\nhost = "x"\nca_file = "junk.pem"\n')
    _, problems = check_config(path)
    assert len(problems) == 1 and "forwarding.upstream.ca_file: " in problems[0] and "no PEM CA certificate" in problems[0]


def test_every_bad_setting_is_reported_not_only_the_first(tmp_path: Path) -> None:
    path = write_config(tmp_path, """
[gateway]
metrics_port = 70000
colour = "blue"
[[broker.listeners]]
port = -1
[[broker.listeners]]
type = "tls"
[forwarding]
cleanup_interval_s = "often"
[forwarding.upstream]
backoff_min_s = 5.0
backoff_max_s = 1.0
""")
    config, problems = check_config(path)
    assert config is None
    paths = [problem.split(":")[0] for problem in problems]
    assert paths == ["gateway.colour", "gateway.metrics_port", "broker.listeners[0].port", "broker.listeners[1].certfile",
                     "forwarding.cleanup_interval_s", "forwarding.upstream.backoff_max_s"], problems


def test_files_are_checked_despite_errors_in_other_sections(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[gateway]\nmetrics_port = "x"\n[broker.auth]\nacl_file = "missing-acl"\n')
    _, problems = check_config(path)
    assert [p.split(":")[0] for p in problems] == ["gateway.metrics_port", "broker.auth.acl_file"], problems


@pytest.mark.parametrize("gateway_id", ["gw/#", "gw+1", "gw/1", "gw\\u0001", "gw\\t", ""])
def test_a_gateway_id_that_cannot_be_a_topic_level_is_refused(tmp_path: Path, gateway_id: str) -> None:
    """The gateway id is a level of every upstream topic (``gateways/{gateway_id}/...``) and of ``$SYS``.
    Before: check-config passed a wildcard, a '/' or a control character in it, and ``run`` then
    dead-lettered every message as unsendable (or mosquitto refused them all)."""
    _, problems = check_config(write_config(tmp_path, f'[gateway]\nid = "{gateway_id}"\n'))
    assert [p.split(":")[0] for p in problems] == ["gateway.id"], problems


def test_forwarding_enabled_without_a_manifest(tmp_path: Path) -> None:
    _, problems = check_config(write_config(tmp_path, "[forwarding]\nenabled = true\n"))
    assert problems == ["forwarding.manifest: forwarding is enabled but names no manifest: no message would be routed"]


def test_forwarding_enabled_with_a_manifest_of_no_routes(tmp_path: Path) -> None:
    """What doctor calls a problem (every device message accepted and dropped); before, check-config passed it."""
    (tmp_path / "manifest.json").write_text(json.dumps({"schemaVersion": "1.2", "routes": {}}))
    _, problems = check_config(write_config(tmp_path, '[forwarding]\nenabled = true\nmanifest = "manifest.json"\n'))
    assert [p.split(":")[0] for p in problems] == ["forwarding.manifest"] and "no routes" in problems[0], problems
    _, problems = check_config(write_config(tmp_path, '[forwarding]\nenabled = false\nmanifest = "manifest.json"\n'))
    assert problems == []


def test_an_empty_upstream_host_is_refused(tmp_path: Path) -> None:
    """An empty host is not "no upstream": the link would try to connect to '' for ever."""
    _, problems = check_config(write_config(tmp_path, '[forwarding.upstream]\nhost = " "\n'))
    assert [p.split(":")[0] for p in problems] == ["forwarding.upstream.host"], problems


def test_an_unreadable_or_broken_config_file_is_one_problem(tmp_path: Path) -> None:
    assert check_config(tmp_path / "none.toml")[1][0].startswith("cannot read")
    assert "not valid TOML" in check_config(write_config(tmp_path, "[broker\n"))[1][0]


acl_lines = st.lists(st.one_of(
    st.sampled_from(["user alice", "topic read a/#", "pattern write %c/x", "topic sometimes x", "topik a", "user",
                     "# comment", "", "topic", "topic read a/#/b", "  topic write +/y"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20).map(lambda t: t.replace("\n", " "))),
    max_size=12)


@campaign(150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(acl_lines)
def test_every_bad_acl_line_is_named_and_a_good_file_has_none(tmp_path: Path, lines: list[str]) -> None:
    """Hostile ACL files: the check ends, names each bad line once, and says nothing about a file that
    parses - the same verdict as the gateway's own parser."""
    (tmp_path / "acl").write_text("\n".join(lines), encoding="utf-8")
    _, problems = check_config(write_config(tmp_path, '[broker.auth]\nacl_file = "acl"\n'))
    try:
        Acl.parse((tmp_path / "acl").read_text(encoding="utf-8"), str(tmp_path / "acl"))
    except ValueError:
        assert problems
    else:
        assert problems == []
    numbers = [int(p.split(f"{tmp_path / 'acl'}:")[1].split(":")[0]) for p in problems]
    count = len("\n".join(lines).splitlines())  # as the parser counts: \x1e, \u2028 ... end a line too
    assert len(numbers) == len(set(numbers)) and all(1 <= n <= count for n in numbers)
