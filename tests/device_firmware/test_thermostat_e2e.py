"""Thermostats (real micropython) against our gateway (broker + state store, `python -m appliance run`).

The set point is the state store key `<thermostat>\\setPoint`; a CPython client on paho-mqtt
(appliance.statestore.client) changes it, and the firmware's stdout (the simulated relay prints
every switch) and its telemetry show what the thermostat did.
"""

import json
import signal
import time
from pathlib import Path

import pytest

from appliance.statestore.client import StateStoreClient
from testing.processes import GatewayProcess, MosquittoProcess
from tests.device_firmware.thermostat_rig import start_thermostat, thermostat_config

OPERATOR_TIMEOUT_S = 30.0


@pytest.fixture
def gateway(tmp_path):
    gw = GatewayProcess(tmp_path / "gateway").start()
    yield gw
    gw.kill9()


@pytest.fixture
def store(gateway):
    """The operator's client. Its timeout is how long a request may wait for its answer before the test
    fails, not a bound any test checks: on a busy machine the gateway's main thread was seen waiting
    6 s for a CPU (make test-busy), and a 5 s timeout failed a SET there."""
    with StateStoreClient(gateway.host, gateway.port, client_id="e2e-operator", timeout=OPERATOR_TIMEOUT_S) as client:
        yield client


def key(name: str) -> str:
    return name + "\\setPoint"


def test_set_point_change_switches_the_heater_within_one_second(tmp_path, gateway, store, micropython, paho_peer):
    fw = start_thermostat(micropython, tmp_path / "t-e1", thermostat_config("t-e1", gateway.host, gateway.port))
    fw.expect(r"^relay on$")  # 18 C room, 20 C default
    fw.expect(r"^registered t-e1\\setPoint$")
    for value, relay in ((b"15", "off"), (b"25.5", "on")):
        mark, sent = len(fw.lines), time.monotonic()
        assert store.set(key("t-e1"), value).applied
        index, _ = fw.expect(rf"^relay {relay}$", timeout=2, after=mark)
        # Measured from before the SET request: the store's round trip is inside the second.
        assert fw.times[index] - sent < 1.0, f"relay {relay} after {fw.times[index] - sent:.3f} s"
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe("devices/t-e1/messages/events/data")
    data = peer.next_json("/data")
    assert (data["set_point"], data["set_point_source"], data["heater"], data["registered"]) == (25.5, "notify", True, True)
    assert json.loads((tmp_path / "t-e1" / "setpoint.json").read_text())["set_point"] == 25.5


def test_twenty_thermostats_each_see_only_their_own_key(tmp_path, gateway, store, micropython):
    names = [f"t-{i:02d}" for i in range(20)]
    fws = {name: start_thermostat(micropython, tmp_path / name, thermostat_config(name, gateway.host, gateway.port))
           for name in names}
    for name, fw in fws.items():
        fw.expect(rf"^registered {name}\\setPoint$", timeout=30)
    wanted = {name: 10.0 + i for i, name in enumerate(names)}
    for name, value in wanted.items():
        assert store.set(key(name), str(value)).applied
    for name, fw in fws.items():
        fw.expect(rf"^set point {wanted[name]} from notify$", timeout=10)
    # Let any stray notification arrive before counting: one more change each, and wait for it.
    for name, value in wanted.items():
        assert store.set(key(name), str(value + 0.5)).applied
    for name, fw in fws.items():
        fw.expect(rf"^set point {wanted[name] + 0.5} from notify$", timeout=10)
        seen = [line for line in fw.lines if line.startswith("set point ") and "from" in line]
        assert seen == [f"set point {wanted[name]} from notify", f"set point {wanted[name] + 0.5} from notify"], fw.output()
        assert "notification for a key not ours" not in fw.output()


def test_gateway_restart_reconnect_reregister_and_catch_up(tmp_path, gateway, micropython):
    config = thermostat_config("t-rs", gateway.host, gateway.port)
    fw = start_thermostat(micropython, tmp_path / "t-rs", config)
    first, _ = fw.expect(r"^registered t-rs\\setPoint$")

    # 1. The gateway dies and comes back: the thermostat reconnects and registers again by itself.
    gateway.kill9()
    lost, _ = fw.expect(r"^connection lost:", after=first)
    gateway.start()
    again, _ = fw.expect(r"^registered t-rs\\setPoint$", timeout=10, after=lost)
    with StateStoreClient(gateway.host, gateway.port, timeout=OPERATOR_TIMEOUT_S) as store:
        assert store.set(key("t-rs"), b"22").applied
    fw.expect(r"^set point 22.0 from notify$", after=again)  # KEYNOTIFY was sent again

    # 2. A change made while the thermostat is away is caught up by the GET after re-registering.
    fw.process.send_signal(signal.SIGSTOP)
    try:
        mark = len(fw.lines)
        gateway.kill9()
        gateway.start()
        with StateStoreClient(gateway.host, gateway.port, timeout=OPERATOR_TIMEOUT_S) as store:
            assert store.set(key("t-rs"), b"16").applied
    finally:
        fw.process.send_signal(signal.SIGCONT)
    back, _ = fw.expect(r"^registered t-rs\\setPoint$", timeout=10, after=mark)
    fw.expect(r"^set point 16.0 from get$", after=mark)
    fw.expect(r"^relay off$", after=mark)  # 18 C room, 16 C set point


CLOCK_SHIFT = Path(__file__).resolve().parent / "clock_shift"


@pytest.mark.parametrize("hours", [5, -5])
def test_a_device_clock_hours_off_registers_and_takes_the_time_from_the_gateway(
        tmp_path, gateway, store, micropython, paho_peer, monkeypatch, hours):
    monkeypatch.setenv("CLOCK_SHIFT_S", str(hours * 3600))
    name = "t-clk-ahead" if hours > 0 else "t-clk-behind"
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe(f"devices/{name}/messages/events/data")
    fw = start_thermostat(micropython, tmp_path / name, thermostat_config(name, gateway.host, gateway.port),
                          before=(CLOCK_SHIFT,))
    _, off = fw.expect(r"^clock: (-?\d+) ms off the gateway's, corrected$")
    assert abs(int(off.group(1)) + hours * 3600_000) < 5_000, off.group(0)
    fw.expect(rf"^registered {name}\\setPoint$")
    assert store.set(key(name), b"24").applied  # the thermostat's HLC now agrees with the store's
    fw.expect(r"^set point 24.0 from notify$")
    assert store.get(name + "\\firmware").value == b"0.1.0"  # what it reported to read the clock
    while not (data := peer.next_json("/data"))["registered"]:
        pass
    assert abs(data["ts_ms"] - time.time() * 1000) < 5_000, data
    assert "ignoring clock" not in fw.output()


def test_a_hung_gateway_is_detected_by_its_silence_and_reconnected_after(tmp_path, gateway, micropython):
    # The case is keep-alive 10 s and SIGSTOP for 25 s; this is the same at a fifth of the
    # scale. Telemetry every 300 ms keeps the thermostat sending, so only what it receives can tell.
    config = thermostat_config("t-hung", gateway.host, gateway.port)
    config["broker"]["keepalive"] = 2
    fw = start_thermostat(micropython, tmp_path / "t-hung", config)
    registered, _ = fw.expect(r"^registered t-hung\\setPoint$")
    gateway.process.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        lost, _ = fw.expect(r"^connection lost: .*ETIMEDOUT", timeout=5, after=registered)
        detected = fw.times[lost] - stopped
        assert detected <= 2 * 1.5 + 0.5, f"detected after {detected:.1f} s"
        time.sleep(6 - (time.monotonic() - stopped))  # the hang itself is the test's input, not a wait
    finally:
        gateway.process.send_signal(signal.SIGCONT)
    fw.expect(r"^registered t-hung\\setPoint$", timeout=15, after=lost)
    assert fw.process.poll() is None and "fault" not in fw.output()


def test_malformed_and_out_of_range_set_points_are_ignored_and_reported(tmp_path, gateway, store, micropython, paho_peer):
    workdir = tmp_path / "t-bad"
    fw = start_thermostat(micropython, workdir, thermostat_config("t-bad", gateway.host, gateway.port))
    fw.expect(r"^registered t-bad\\setPoint$")
    assert store.set(key("t-bad"), b"23").applied
    fw.expect(r"^set point 23.0 from notify$")
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe("devices/t-bad/messages/events/data")
    for raw, reason in ((b"hot", "not a number"), (b"99", "out of range [5.0, 30.0]"), (b"", "empty"),
                        (b"nan", "not a number")):
        mark = len(fw.lines)
        assert store.set(key("t-bad"), raw).applied
        fw.expect(r"^set point: rejected ", after=mark)
        rejected = {"value": raw.decode(), "size": len(raw), "reason": reason, "source": "notify"}
        data = peer.next(5, lambda m, rejected=rejected: m.topic.endswith("/data") and m.json()["set_point_rejected"] == rejected).json()
        assert data["set_point"] == 23.0 and data["heater"] is True
    assert json.loads((workdir / "setpoint.json").read_text())["set_point"] == 23.0
    assert store.delete(key("t-bad")).count == 1
    fw.expect(r"^set point: key deleted, keeping 23.0$")


def test_telemetry_and_alerts_reach_the_gateway_on_their_outputs(tmp_path, gateway, store, micropython, paho_peer):
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe("devices/t-tel/messages/events/+")
    config = thermostat_config("t-tel", gateway.host, gateway.port,
                               hardware={"kind": "simulated", "room": {"start_c": 36.0, "heat_c_per_s": 0.0}})
    start_thermostat(micropython, tmp_path / "t-tel", config)
    seen = {}
    while len(seen) < 2:
        msg = peer.next()
        seen.setdefault(msg.topic, msg)
    alert = seen["devices/t-tel/messages/events/alerts"]
    assert alert.qos == 1 and json.loads(alert.payload)["alert"] == "over_temperature"
    data = seen["devices/t-tel/messages/events/data"]
    assert data.properties.ContentType == "application/json"
    assert json.loads(data.payload)["device"] == "t-tel"


ROUTES = {
    "schemaVersion": "1.1",
    "routes": {
        "alerts": {"route": "FROM /messages/* WHERE $outputName = 'alerts' INTO $upstream", "priority": 0},
        "data": {"route": "FROM /messages/* WHERE $outputName = 'data' INTO $upstream", "priority": 1},
    },
}


def test_alerts_take_the_priority_0_route_and_data_the_priority_1_route(tmp_path, micropython, paho_peer):
    with MosquittoProcess(tmp_path / "cloud") as cloud:
        (tmp_path / "manifest.json").write_text(json.dumps(ROUTES))
        (tmp_path / "gateway.toml").write_text(
            '[gateway]\nid = "gw-e2e"\n[forwarding]\nenabled = true\nmanifest = "manifest.json"\n'
            f'[forwarding.upstream]\nhost = "{cloud.host}"\nport = {cloud.port}\n')
        upstream = paho_peer(cloud.host, cloud.port)
        upstream.subscribe("gateways/gw-e2e/devices/#")  # not the gateway's own metrics documents
        with GatewayProcess(tmp_path / "gateway", config=tmp_path / "gateway.toml") as gateway:
            config = thermostat_config("t-rt", gateway.host, gateway.port,
                                       hardware={"kind": "simulated", "room": {"start_c": 36.0, "heat_c_per_s": 0.0}})
            start_thermostat(micropython, tmp_path / "t-rt", config)
            by_output = {}
            while len(by_output) < 2:
                msg = upstream.next(timeout=10)
                props = dict(msg.properties.UserProperty)
                by_output.setdefault(props["gw-output"], (msg, props))
    alert, alert_props = by_output["alerts"]
    assert (alert_props["gw-priority"], alert_props["gw-device-id"]) == ("0", "t-rt")
    assert json.loads(alert.payload)["alert"] == "over_temperature"
    data, data_props = by_output["data"]
    assert (data_props["gw-priority"], data_props["gw-device-id"]) == ("1", "t-rt")
    assert json.loads(data.payload)["device"] == "t-rt"
    assert data.topic == "gateways/gw-e2e/devices/t-rt/messages/events"
    assert data.properties.ContentType == "application/json"
