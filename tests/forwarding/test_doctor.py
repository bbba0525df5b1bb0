"""``appliance doctor`` on store-and-forward: against a running gateway (the real process, paho devices,
mosquitto behind the throttling relay as the cloud) and against the files it reads, written as the gateway
writes them. Before these checks the doctor said "no problems found" with the link down and with 0 routes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.cli import main
from appliance.doctor import check_forwarding, check_store_health, run_checks
from appliance.findings import Finding, Verdict
from appliance.forwarding.config import ForwardingConfig
from appliance.forwarding.doctor import (
    DEFAULT_THRESHOLDS,
    Thresholds,
    check_dead_letters,
    check_manifest,
    check_metrics_document,
    check_running_routes,
)
from appliance.forwarding.messages import message_from_publish
from appliance.forwarding.queues import MessageStore
from appliance.forwarding.routes import Endpoint, RouteResult
from appliance.forwarding.service import METRICS_FILE, STATUS_FILE, STORE_FILE
from appliance.gateway_config import GatewayConfig, load_config
from testing.campaigns import campaign
from testing.certificates import valid_for
from testing.waiting import wait_until
from tests.forwarding.rig import ForwardingRig, manifest

ALL = {"all": {"route": "FROM /messages/* INTO $upstream", "priority": 2, "timeToLiveSecs": 60}}
QUICK = Thresholds(link_down_s=0.5, stalled_s=0.5)


def problems(findings: list[Finding]) -> list[str]:
    return [f.message for f in findings if f.verdict is Verdict.PROBLEM]


def config_of(rig: ForwardingRig) -> GatewayConfig:
    return load_config(rig.config, {"gateway": {"data_dir": str(rig.gateway.data_dir)}})


def doctor_exit(rig: ForwardingRig, *extra: str) -> int:
    return main(["doctor", "--config", str(rig.config), "--data-dir", str(rig.gateway.data_dir),
                 "--listen", f"{rig.gateway.host}:{rig.gateway.port}", *extra])


@pytest.fixture
def rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    rig = ForwardingRig(tmp_path, ALL, extra_forwarding="metrics_interval_s = 0.1")
    yield rig
    rig.close()


def test_a_healthy_gateway_has_no_forwarding_problem(rig: ForwardingRig) -> None:
    assert rig.device("d1").publish("data", b"{}", {"n": "1"}) == 0
    rig.cloud.wait_for(1)
    wait_until(lambda: any("upstream link up" in f.message for f in check_forwarding(config_of(rig), QUICK)), 10)
    findings = check_forwarding(config_of(rig), QUICK)
    assert problems(findings) == [], findings
    assert any("routes with 1 routes" in f.message for f in findings)


def test_the_link_down_longer_than_the_threshold_is_a_problem(rig: ForwardingRig, capsys: pytest.CaptureFixture[str]) -> None:
    wait_until(lambda: any("upstream link up" in f.message for f in check_forwarding(config_of(rig), QUICK)), 10)
    rig.relay.set(up=False)
    rig.relay.cut()

    def link_reported_down() -> bool:
        return any("upstream link down for" in p for p in problems(check_forwarding(config_of(rig), QUICK)))

    wait_until(link_reported_down, 20, "doctor reports the link down")
    assert doctor_exit(rig, "--link-down-after", "0.5") == 1
    out = capsys.readouterr().out
    assert "PROBLEM  forwarding upstream link down for" in out
    # The default threshold (5 minutes) is not reached yet: a link that just dropped is not a problem.
    assert not any("link down" in p for p in problems(check_forwarding(config_of(rig), Thresholds())))


def test_no_routes_and_a_rejected_manifest_are_problems(rig: ForwardingRig) -> None:
    rig.manifest_path.write_text(manifest({}))
    wait_until(lambda: rig.status()["routes"] == [], 10, "the gateway runs 0 routes")
    found = problems(check_forwarding(config_of(rig), QUICK))
    assert any("has no routes" in p for p in found) and any("no routes loaded" in p for p in found), found
    rig.manifest_path.write_text('{"schemaVersion": "1.1.0", "routes": {"r": "FROM /messages/* INTO $nowhere"}}')
    wait_until(lambda: rig.status()["error"] is not None, 10, "the gateway rejects the manifest")
    found = problems(check_forwarding(config_of(rig), QUICK))
    assert any("is not valid: $.routes.r" in p for p in found), found
    assert any("rejected its manifest" in p and "$nowhere" in p for p in found), found


def test_a_queue_past_half_its_ttl_is_a_problem(tmp_path: Path) -> None:
    rig = ForwardingRig(tmp_path, {"all": {"route": "FROM /messages/* INTO $upstream", "priority": 3, "timeToLiveSecs": 4}},
                        extra_forwarding="metrics_interval_s = 0.1")
    try:
        rig.relay.set(up=False)
        rig.relay.cut()
        assert rig.device("d1").publish("data", b"{}", {"n": "1"}) == 0
        document: dict = {}

        def queued() -> bool:
            metrics = rig.gateway.data_dir / METRICS_FILE
            if not metrics.exists():  # the service writes it every metrics_interval_s, the first time too
                return False
            document.update(json.loads(metrics.read_text()))
            return document["endpoints"].get("upstream", {}).get("3", {}).get("depth") == 1

        wait_until(queued, 10, "the message is queued")
        assert document["endpoints"]["upstream"]["3"]["oldest_ttl_s"] == 4
        # Judged at the document's time plus the age it stands for: no sleeping through the TTL.
        config = config_of(rig)
        at_written = check_forwarding(config, Thresholds(), now_ms=document["ts_ms"])
        assert not any("upstream_Pri3" in p for p in problems(at_written))
        later = check_forwarding(config, Thresholds(), now_ms=document["ts_ms"] + 2500)
        assert any("queue upstream_Pri3: the oldest of 1 messages" in p and "4 s TTL" in p for p in problems(later))
    finally:
        rig.close()


def test_dead_letters_are_a_problem_until_cleared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_dead_letters(tmp_path) == []  # no store yet: nothing to say
    store = MessageStore(tmp_path / STORE_FILE)
    message = message_from_publish("devices/d1/messages/events/n=1", b"{}", [], None)
    assert message is not None
    seq, _ = store.add(message, [RouteResult(Endpoint("upstream"), 2, 60)])
    assert [f.verdict for f in check_dead_letters(tmp_path)] == [Verdict.OK]
    store.dead_letter("upstream", 2, [seq], "Not authorized (0x87)")
    store.close()
    [problem] = check_dead_letters(tmp_path)
    assert problem.verdict is Verdict.PROBLEM and "1 dead letters for upstream" in problem.message
    assert "Not authorized (0x87)" in problem.message
    assert main(["routes", "dead-letters", "--data-dir", str(tmp_path), "--clear"]) == 0
    assert "removed 1 dead letters" in capsys.readouterr().err
    assert [f.verdict for f in check_dead_letters(tmp_path)] == [Verdict.OK]


def test_manifest_checks_on_the_file(tmp_path: Path) -> None:
    assert "names no file" in problems(check_manifest(ForwardingConfig(enabled=True)))[0]
    path = tmp_path / "m.json"
    path.write_text("{")
    assert "not valid JSON" in problems(check_manifest(ForwardingConfig(enabled=True, manifest=path)))[0]
    path.write_text(manifest({"r": "FROM /messages/* INTO $upstream"}))
    assert problems(check_manifest(ForwardingConfig(enabled=True, manifest=path))) == []


# -- the metrics document, written as the gateway writes it

NOW = 1_790_000_000_000
PID = 4242


def write_document(data_dir: Path, **changes: object) -> None:
    document: dict = {
        "gateway_id": "gw1", "ts_ms": NOW - 1000, "started_ms": NOW - 3_600_000,
        "endpoints": {"upstream": {"0": {"depth": 5, "oldest_age_s": 10.0, "oldest_ttl_s": 7200, "sent": 1, "expired": 0,
                                         "dropped": 0, "retries": 0, "dead_lettered": 0}}},
        "links": {"upstream": {"bytes_sent": 10, "rate_bytes_per_s": 1200.0, "rtt_s": 0.5, "connected": True,
                               "since_ms": NOW - 1_800_000}},
        "store": {"healthy": True, "disk_full": False, "failed_commits": 0},
        "pump": {"upstream": {"running": True, "restarts": 0, "head_moved_ms": NOW - 2000}},
    }
    document.update(changes)
    (data_dir / METRICS_FILE).write_text(json.dumps(document))


def document_problems(data_dir: Path, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[str]:
    return problems(check_metrics_document(data_dir, NOW, PID, 60.0, thresholds))


def test_a_healthy_document(tmp_path: Path) -> None:
    write_document(tmp_path)
    assert document_problems(tmp_path) == []


def test_a_pump_that_is_not_running_or_does_not_move_is_a_problem(tmp_path: Path) -> None:
    write_document(tmp_path, pump={"upstream": {"running": False, "restarts": 4, "head_moved_ms": NOW - 2000}})
    assert document_problems(tmp_path) == ["the pump of upstream is not running (4 restarts): its queues do not drain"]
    write_document(tmp_path, pump={"upstream": {"running": True, "restarts": 0, "head_moved_ms": NOW - 900_000}})
    [stalled] = document_problems(tmp_path)
    assert stalled == "the pump of upstream is stalled: 5 messages queued, the link is up, its head last moved 15 min ago"
    write_document(tmp_path, pump={"upstream": {"running": True, "restarts": 0, "head_moved_ms": None}})
    assert "never moved" in document_problems(tmp_path)[0]
    # Not stalled: the link came back a minute ago, or nothing is queued, or the link is down.
    links = {"upstream": {"connected": True, "since_ms": NOW - 60_000}}
    write_document(tmp_path, links=links, pump={"upstream": {"running": True, "restarts": 0, "head_moved_ms": NOW - 900_000}})
    assert document_problems(tmp_path) == []
    write_document(tmp_path, endpoints={}, pump={"upstream": {"running": True, "restarts": 0, "head_moved_ms": None}})
    assert document_problems(tmp_path) == []
    write_document(tmp_path, links={"upstream": {"connected": False, "since_ms": NOW - 10_000}},
                   pump={"upstream": {"running": True, "restarts": 0, "head_moved_ms": None}})
    assert document_problems(tmp_path) == []


def test_a_module_input_pump_is_judged_from_the_start(tmp_path: Path) -> None:
    endpoints = {"modules/m/inputs/i": {"1": {"depth": 2, "oldest_age_s": 1.0, "oldest_ttl_s": 7200}}}
    write_document(tmp_path, endpoints=endpoints, pump={"modules/m/inputs/i": {"running": True, "restarts": 0, "head_moved_ms": None}})
    assert "the pump of modules/m/inputs/i is stalled" in document_problems(tmp_path)[0]


def test_a_failing_store_a_stale_document_and_a_missing_one(tmp_path: Path) -> None:
    write_document(tmp_path, store={"healthy": False, "disk_full": True, "failed_commits": 12})
    assert document_problems(tmp_path) == [
        "forwarding.db cannot commit (the disk is full): device messages are refused (12 failed commits)"]
    write_document(tmp_path, ts_ms=NOW - 600_000)
    assert "was last written 10 min ago (every 60 s expected): forwarding is stuck" in document_problems(tmp_path)[0]
    (tmp_path / METRICS_FILE).unlink()
    assert "has written no" in document_problems(tmp_path)[0]
    assert check_metrics_document(tmp_path, NOW, None, 60.0) == []  # no gateway running: the ports check says so


def test_a_document_from_an_older_gateway_is_read_as_far_as_it_goes(tmp_path: Path) -> None:
    write_document(tmp_path)
    document = json.loads((tmp_path / METRICS_FILE).read_text())
    for key in ("pump", "store", "started_ms"):
        del document[key]
    (tmp_path / METRICS_FILE).write_text(json.dumps(document))
    assert document_problems(tmp_path) == []


def test_running_routes_status(tmp_path: Path) -> None:
    assert check_running_routes(tmp_path, None) == []
    assert "has written no forwarding-routes.json" in problems(check_running_routes(tmp_path, PID))[0]
    status = {"pid": PID, "error": None, "routes": [{"name": "r"}]}
    (tmp_path / STATUS_FILE).write_text(json.dumps(status))
    assert problems(check_running_routes(tmp_path, PID)) == []
    (tmp_path / STATUS_FILE).write_text(json.dumps(status | {"pid": PID + 1}))  # left by another process
    assert problems(check_running_routes(tmp_path, PID))


def test_store_health_from_the_prometheus_page() -> None:
    page = ('appliance_store_healthy{store="broker"} 1\nappliance_store_healthy{store="statestore"} 0\n'
            'appliance_store_healthy_other{store="x"} 0\n')
    findings = check_store_health(page)
    assert [(f.verdict, f.message.split(" store")[0]) for f in findings] == [
        (Verdict.OK, "the broker"), (Verdict.PROBLEM, "the statestore")]


def test_thresholds_are_seconds(tmp_path: Path) -> None:
    write_document(tmp_path, links={"upstream": {"connected": False, "since_ms": NOW - 200_000}})
    assert document_problems(tmp_path) == []  # 200 s < 300 s
    assert "upstream link down for 3 min" in document_problems(tmp_path, Thresholds(link_down_s=100))[0]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=12)


@campaign(200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["endpoints", "links", "store", "pump", "started_ms", "ts_ms"]), json_values))
def test_a_damaged_document_is_a_finding_not_a_crash(tmp_path: Path, changes: dict) -> None:
    write_document(tmp_path, **changes)
    findings = check_metrics_document(tmp_path, NOW, PID, 60.0)
    assert findings and all(isinstance(f, Finding) for f in findings)


def test_an_expired_upstream_certificate_is_a_problem(tmp_path: Path) -> None:
    """The cloud refuses an expired client certificate at every handshake: the link stays down for ever.
    Before: doctor checked only the listeners' certificates and found nothing wrong offline."""
    fine, _ = valid_for(tmp_path, "fine", 300)
    expired, expired_key = valid_for(tmp_path, "expired", -1)
    (tmp_path / "m.json").write_text(manifest({"all": "FROM /messages/* INTO $upstream"}))
    upstream = f'host = "cloud.example"\ntls = true\nca_file = "{fine}"\ncert_file = "{expired}"\nkey_file = "{expired_key}"\n'
    path = tmp_path / "gateway.toml"
    path.write_text(f'[forwarding]\nenabled = true\nmanifest = "m.json"\n[forwarding.upstream]\n{upstream}')
    findings = run_checks(load_config(path))
    assert [f.message.split(":")[0] for f in findings if f.check == "tls" and f.verdict is Verdict.PROBLEM] == [
        f"TLS upstream cert_file {expired}"]
    assert any(f.message.startswith(f"TLS upstream ca_file {fine}:") and f.verdict is Verdict.OK for f in findings)
    plain = upstream.replace("tls = true", "tls = false")
    path.write_text(f'[forwarding]\nenabled = true\nmanifest = "m.json"\n[forwarding.upstream]\n{plain}')
    assert not any(f.check == "tls" for f in run_checks(load_config(path))), "certificates a plain link does not use"
