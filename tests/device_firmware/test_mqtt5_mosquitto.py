"""device_firmware/mqtt5.py under the real micropython against the real mosquitto, paho-mqtt as peer."""

import json
import signal

from testing.processes import MosquittoProcess
from tests.device_firmware.micropython import MP_TESTS

SCENARIOS = MP_TESTS / "mqtt_scenarios.py"


def test_publish_subscribe_qos_properties_and_request_response(mosquitto, micropython, paho_peer):
    peer = paho_peer(mosquitto.host, mosquitto.port)
    peer.subscribe("fw/out/#")
    peer.subscribe("fw/reply")
    fw = micropython([SCENARIOS, "echo", mosquitto.host, mosquitto.port])
    fw.expect(r"^CONNACK present=False$")
    fw.expect(r"^SUBSCRIBED granted=1$")

    peer.publish("fw/in/a", b"ping1", qos=1, user_properties=[("k", "v"), ("k", "v2")],
                 ResponseTopic="fw/reply", CorrelationData=b"\x01\x02", ContentType="text/plain")
    _, match = fw.expect(r"^MSG (.*fw/in/a.*)$")
    msg = json.loads(match.group(1))
    assert msg["payload"] == "ping1"
    assert msg["props"]["38"] == [["k", "v"], ["k", "v2"]]  # order and duplicates kept
    assert msg["props"]["8"] == "fw/reply" and msg["props"]["9"] == "0102" and msg["props"]["3"] == "text/plain"
    reply = peer.next()
    assert (reply.topic, reply.payload, reply.qos) == ("fw/reply", b"re:ping1", 1)
    assert reply.properties.CorrelationData == b"\x01\x02"
    assert reply.properties.UserProperty == [("from", "fw")]

    peer.publish("fw/in/q0", b"zero", qos=0)
    _, match = fw.expect(r"^MSG (.*fw/in/q0.*)$")
    assert json.loads(match.group(1))["payload"] == "zero"
    peer.publish("fw/in/stop", b"", qos=1)
    fw.expect(r"^BYE$")
    got = {m.topic: m for m in (peer.next(), peer.next())}
    assert got["fw/out/q0"].payload == b"zero" and got["fw/out/q0"].qos == 0
    assert got["fw/out/q1"].payload == b"one" and got["fw/out/q1"].qos == 1
    assert got["fw/out/q1"].properties.UserProperty == [("a", "1"), ("a", "2")]
    assert got["fw/out/q1"].properties.ContentType == "text/plain"
    assert fw.wait() == 0


def test_keepalive_pings_hold_the_connection_and_a_silent_broker_is_detected(mosquitto, micropython):
    fw = micropython([SCENARIOS, "keepalive", mosquitto.host, mosquitto.port])
    fw.expect(r"^CONNECTED$")
    # Two answered pings take > 1.5 s: longer than mosquitto waits (1.5 x keepalive) for a silent client.
    first, _ = fw.expect(r"^PINGRESP$", timeout=5)
    fw.expect(r"^PINGRESP$", timeout=5, after=first + 1)
    mosquitto.process.send_signal(signal.SIGSTOP)
    try:
        fw.expect(r"^DEAD errno=110$", timeout=5)
    finally:
        mosquitto.process.send_signal(signal.SIGCONT)


def test_session_expiry_keeps_subscription_and_queued_qos1_message(mosquitto, micropython, paho_peer):
    fw = micropython([SCENARIOS, "session", mosquitto.host, mosquitto.port, "fw-sess", "1"])
    fw.expect(r"^CONNACK present=False$")
    fw.expect(r"^BYE$")
    assert fw.wait() == 0
    paho_peer(mosquitto.host, mosquitto.port).publish("fw/s", b"while-away", qos=1)
    fw = micropython([SCENARIOS, "session", mosquitto.host, mosquitto.port, "fw-sess", "2"])
    fw.expect(r"^CONNACK present=True$")
    fw.expect(r"^MSG fw/s while-away$")


def test_reconnects_after_broker_restart(tmp_path, micropython, paho_peer):
    broker = MosquittoProcess(tmp_path / "m").start()
    try:
        fw = micropython([SCENARIOS, "reconnect", broker.host, broker.port])
        first, _ = fw.expect(r"^READY$")
        broker.stop()
        fw.expect(r"^LOST errno=\d+$")
        broker = MosquittoProcess(tmp_path / "m", port=broker.port).start()
        fw.expect(r"^RECONNECTED$")
        fw.expect(r"^READY$", after=first + 1)
        paho_peer(broker.host, broker.port).publish("fw/r", b"after-restart", qos=1)
        fw.expect(r"^MSG fw/r after-restart$")
    finally:
        broker.stop()


def test_refused_publish_carries_the_reason_code(tmp_path, micropython):
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite fw/#\n")
    # "user root": a root mosquitto otherwise drops to user mosquitto, which cannot read tmp_path.
    with MosquittoProcess(tmp_path / "m", extra_config=f"acl_file {acl}\nuser root\n") as broker:
        fw = micropython([SCENARIOS, "refusals", broker.host, broker.port])
        fw.expect(r"^PUBACK fw/allowed ok$")
        fw.expect(r"^PUBACK denied/x refused code=0x87$")  # not authorized
        fw.expect(r"^TOO BIG packet of \d+ bytes exceeds the 1024 byte send buffer$")
        fw.expect(r"^PING answered=True$")  # the connection survived both refusals
        fw.expect(r"^BYE$")


def test_refused_connect_carries_the_reason_code(tmp_path, micropython):
    with MosquittoProcess(tmp_path / "m", extra_config="allow_anonymous false\n") as broker:
        fw = micropython([SCENARIOS, "refused_connect", broker.host, broker.port])
        fw.expect(r"^CONNECT refused code=0x87$")  # not authorized
