"""The thermostat application against mosquitto: everything that does not need the state store.

mosquitto answers no state store request, so these thermostats run unregistered; that is itself
tested: heating and telemetry must not wait for the store.
"""

import json
import time

from testing.processes import MosquittoProcess, free_port
from tests.device_firmware.thermostat_rig import start_thermostat, thermostat_config


def test_telemetry_on_the_data_output_while_the_store_does_not_answer(tmp_path, mosquitto, micropython, paho_peer):
    peer = paho_peer(mosquitto.host, mosquitto.port)
    peer.subscribe("devices/#")
    fw = start_thermostat(micropython, tmp_path / "t-01", thermostat_config("t-01", mosquitto.host, mosquitto.port))
    fw.expect(r"^relay on$")  # 18 C in the room, 20 C default set point
    fw.expect(r"^register failed: no reply within 1000 ms$", timeout=5)
    msg = peer.next()
    while msg.topic != "devices/t-01/messages/events/data":
        msg = peer.next()
    assert msg.properties.ContentType == "application/json"
    data = json.loads(msg.payload)
    assert data["device"] == "t-01" and data["fw"] == "0.1.0"
    assert data["heater"] is True and data["set_point"] == 20.0 and data["set_point_source"] == "default"
    assert 17.5 < data["temperature"] < 18.5
    assert data["registered"] is False and data["set_point_rejected"] is None
    assert abs(data["ts_ms"] - time.time() * 1000) < 60_000  # Unix epoch milliseconds
    assert data["mem_peak"] > 10_000  # gc.mem_alloc() of a running app; the 64 KB bound: tests/images/test_firmware_image.py
    second = peer.next_json("/data")
    assert second["seq"] > data["seq"]


def test_alerts_on_the_alerts_output(tmp_path, mosquitto, micropython, paho_peer):
    peer = paho_peer(mosquitto.host, mosquitto.port)
    peer.subscribe("devices/t-02/messages/events/alerts")
    fault = tmp_path / "sensor-fault"
    config = thermostat_config("t-02", mosquitto.host, mosquitto.port,
                               hardware={"kind": "simulated",
                                         "room": {"start_c": 40.0, "heat_c_per_s": 0.0, "fault_file": str(fault)}})
    fw = start_thermostat(micropython, tmp_path / "t-02", config)
    alert = peer.next()
    assert alert.qos == 1 and alert.properties.ContentType == "application/json"
    body = json.loads(alert.payload)
    assert body["alert"] == "over_temperature" and body["device"] == "t-02" and body["temperature"] > 35
    fw.expect(r"^connected$")
    fault.write_text("")
    assert json.loads(peer.next().payload)["alert"] == "sensor_failure"
    # Raised once per episode, not at every control tick: five failed readings, one alert.
    index = -1
    for _ in range(5):
        index, _ = fw.expect(r"^sensor failed: simulated sensor fault$", after=index + 1)
    assert fw.lines[: index + 1].count("alert sensor_failure") == 1, fw.output()
    assert "relay on" not in fw.lines  # 40 C room, and a failed sensor: never heated


def test_boots_offline_on_the_set_point_in_flash_then_connects_with_backoff(tmp_path, micropython, paho_peer):
    port = free_port()  # nothing listens there yet
    workdir = tmp_path / "t-03"
    workdir.mkdir()
    (workdir / "setpoint.json").write_text(json.dumps({"set_point": 26.0, "version": None}))
    config = thermostat_config("t-03", "127.0.0.1", port,
                               hardware={"kind": "simulated", "room": {"start_c": 24.0, "heat_c_per_s": 0.0}})
    fw = start_thermostat(micropython, workdir, config)
    fw.expect(r"^relay on$")  # 24 C < 26 C from flash; the default 20 C would have kept it off
    first, _ = fw.expect(r"^connect failed:")
    fw.expect(r"^connect failed:", after=first + 1)
    with MosquittoProcess(tmp_path / "m", port=port) as broker:
        peer = paho_peer(broker.host, broker.port)
        peer.subscribe("devices/t-03/messages/events/data")
        fw.expect(r"^connected$", timeout=5)
        data = peer.next_json("/data")
        assert (data["set_point"], data["set_point_source"], data["heater"]) == (26.0, "flash", True)
