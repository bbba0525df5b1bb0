"""``mosquitto_pub`` and ``mosquitto_sub`` (Debian's mosquitto-clients) against our gateway, with ``-V``
mqttv311 and mqttv5 where the behaviour exists in both."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence

import pytest

from testing.processes import GatewayProcess
from tests.broker.clients import PahoClient, unique

VERSIONS = ["mqttv311", "mqttv5"]


def start_sub(gateway: GatewayProcess, args: Sequence[str]) -> subprocess.Popen[str]:
    """mosquitto_sub in the background; ``-d`` makes it print once it holds its SUBACK (line-buffered by
    ``stdbuf`` so we see that line at once)."""
    process = subprocess.Popen(
        ["stdbuf", "-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", str(gateway.port), "-d", "-W", "15", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:  # wait for the SUBACK, the event that makes publishing safe
        if "SUBACK" in line:
            return process
    raise AssertionError("mosquitto_sub never got a SUBACK")


def finish(process: subprocess.Popen[str]) -> list[str]:
    out, _ = process.communicate(timeout=20)
    return [line for line in out.splitlines() if not line.startswith(("Client ", "Subscribed (")) and line.strip()]


def pub(gateway: GatewayProcess, *args: str) -> None:
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(gateway.port), *args], check=True, timeout=10)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", ["0", "1", "2"])
def test_pub_sub_at_each_qos(gateway: GatewayProcess, version: str, qos: str) -> None:
    topic = unique("cli")
    sub = start_sub(gateway, ["-V", version, "-t", f"{topic}/#", "-q", qos, "-C", "3", "-v"])
    for index in range(3):
        pub(gateway, "-V", version, "-t", f"{topic}/{index}", "-q", qos, "-m", f"hello {index}")
    assert finish(sub) == [f"{topic}/{index} hello {index}" for index in range(3)]


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_set_and_cleared(gateway: GatewayProcess, version: str) -> None:
    topic = unique("cli-retained")
    pub(gateway, "-V", version, "-t", topic, "-r", "-q", "1", "-m", "kept")
    out = subprocess.run(
        ["mosquitto_sub", "-p", str(gateway.port), "-V", version, "-t", topic, "-C", "1", "-W", "5", "-F", "%r %p"],
        capture_output=True, text=True, timeout=10,
    )
    assert out.stdout.strip() == "1 kept"
    pub(gateway, "-V", version, "-t", topic, "-r", "-n")
    # --retained-only prints retained messages and ends at the first live one: the sentinel.
    cleared = start_sub(gateway, ["-V", version, "-t", topic, "--retained-only"])
    pub(gateway, "-V", version, "-t", topic, "-m", "sentinel")
    assert finish(cleared) == []


def test_v5_user_properties_and_content_type_reach_mosquitto_sub(gateway: GatewayProcess) -> None:
    """MQTT 5 only: user properties and content type are PUBLISH properties."""
    topic = unique("cli-props")
    sub = start_sub(gateway, ["-V", "mqttv5", "-t", topic, "-C", "1", "-F", "%P|%C|%p"])
    pub(gateway, "-V", "mqttv5", "-t", topic, "-m", "body", "-D", "publish", "user-property", "room", "kitchen",
        "-D", "publish", "content-type", "text/plain")
    assert finish(sub) == ["room:kitchen|text/plain|body"]


@pytest.mark.parametrize("version", VERSIONS)
def test_will_of_a_killed_mosquitto_sub(gateway: GatewayProcess, version: str) -> None:
    topic = unique("cli-will")
    watcher = PahoClient(gateway.port, v5=version == "mqttv5")
    watcher.connect()
    watcher.subscribe(topic, 1)
    try:
        dying = start_sub(gateway, ["-V", version, "-t", unique("anything"), "--will-topic", topic,
                                    "--will-payload", "lost", "--will-qos", "1"])
        dying.send_signal(signal.SIGKILL)
        dying.wait(5)
        assert watcher.get().payload == b"lost"
    finally:
        watcher.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_persistent_session_of_mosquitto_sub(gateway: GatewayProcess, version: str) -> None:
    client_id = unique("cli-session")
    topic = unique("cli-session-topic")
    expiry = ["-x", "600"] if version == "mqttv5" else []
    first = start_sub(gateway, ["-V", version, "-i", client_id, "-c", *expiry, "-q", "1", "-t", topic, "-E"])
    assert first.wait(10) == 0
    for index in range(3):
        pub(gateway, "-V", version, "-q", "1", "-t", topic, "-m", f"while away {index}")
    # The queued messages arrive right after CONNACK, possibly before the SUBACK of the repeated SUBSCRIBE.
    again = subprocess.run(
        ["mosquitto_sub", "-p", str(gateway.port), "-V", version, "-i", client_id, "-c", *expiry, "-q", "1", "-t", topic,
         "-C", "3", "-W", "10"],
        capture_output=True, text=True, timeout=15,
    )
    assert again.stdout.splitlines() == [f"while away {index}" for index in range(3)]


def test_mosquitto_sub_v5_subscription_options(gateway: GatewayProcess) -> None:
    """MQTT 5 only: retain as published is a subscription option. (mosquitto_sub 2.0.11 has no option for
    Retain Handling, which test_interop_paho.py covers; a ``--retain-handling`` run here only ever got
    mosquitto_sub's "Unknown option" and an empty output.)"""
    topic = unique("cli-options")
    pub(gateway, "-V", "mqttv5", "-t", topic, "-r", "-m", "retained")
    kept = subprocess.run(
        ["mosquitto_sub", "-p", str(gateway.port), "-V", "mqttv5", "-t", topic, "--retain-as-published", "-C", "1",
         "-W", "5", "-F", "%r %p"],
        capture_output=True, text=True, timeout=10,
    )
    assert kept.stdout.strip() == "1 retained"
    pub(gateway, "-V", "mqttv5", "-t", topic, "-r", "-n")
