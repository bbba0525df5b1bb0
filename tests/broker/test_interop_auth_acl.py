"""Passwords and ACLs end to end: a gateway with a password file made by ``appliance passwd`` and a
mosquitto-format ACL file, talked to by paho (3.1.1 and 5), our raw client and mosquitto_pub."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from testing.processes import ROOT, GatewayProcess
from tests.broker.clients import PahoClient, RawClient, unique

ACL = """\
user alice
topic readwrite alice/#
topic read public/#
topic write public/alice

user bob
topic read #
"""


def add_user(password_file: Path, username: str, password: str, create: bool = False) -> None:
    args = [sys.executable, "-m", "appliance", "passwd", "-b", "-I", "1000"]
    if create:
        args.append("-c")
    subprocess.run(args + [str(password_file), username, password], cwd=ROOT, check=True, capture_output=True)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("secured")
    password_file = work / "passwd"
    add_user(password_file, "alice", "wonderland", create=True)
    add_user(password_file, "bob", "builder")
    (work / "acl").write_text(ACL)
    config = work / "gateway.toml"
    config.write_text(
        f'[broker.auth]\nallow_anonymous = false\npassword_file = "{password_file}"\nacl_file = "{work / "acl"}"\n'
    )
    with GatewayProcess(work / "data", config=config) as process:
        yield process


def paho_as(gateway: GatewayProcess, level: int, username: str, password: str) -> PahoClient:
    """A paho client of ``level`` that logs in to ``gateway`` as ``username`` (not connected yet)."""
    client = PahoClient(gateway.port, v5=level == pk.MQTT_5)
    client.client.username_pw_set(username, password)
    return client


def test_wrong_password_and_anonymous_are_refused(secured: GatewayProcess, level: int) -> None:
    cases = [(("alice", b"wonderland"), rc.SUCCESS), (("alice", b"nope"), rc.BAD_USERNAME_OR_PASSWORD),
             (("mallory", b"x"), rc.BAD_USERNAME_OR_PASSWORD), ((None, None), rc.NOT_AUTHORIZED)]
    for (username, password), expected in cases:
        client = RawClient(secured.port, level)
        try:
            host, port = client.sock.getsockname()[:2]
            client_id = unique("auth")
            connack = client.connect(client_id, username=username, password=password)
            # The codec maps 3.1.1 return codes (4, 5) back to the MQTT 5 reasons for comparison.
            assert connack.reason_code == expected, (username, password)
        finally:
            client.close()
        # Issue 24: a refused login at WARNING names the user and the address; a good one at INFO.
        if expected == rc.SUCCESS:
            secured.wait_for_log(rf"INFO .*{client_id} \({host}:{port}\): connected as user 'alice'")
        elif username is not None:
            secured.wait_for_log(rf"WARNING .*{client_id} \({host}:{port}\): connection refused: .*'{username}'")
        else:
            secured.wait_for_log(rf"WARNING .*{client_id} \({host}:{port}\): connection refused: .*no user name")


def test_paho_sees_the_refusal(secured: GatewayProcess, level: int) -> None:
    client = paho_as(secured, level, "alice", "wrong")
    try:
        _flags, reason, _props = client.connect()
        assert reason.is_failure
        assert reason.value == rc.BAD_USERNAME_OR_PASSWORD  # paho reports 3.1.1's return code 4 as 0x86
    finally:
        client.disconnect()


def test_denied_subscribe_gets_0x87_in_v5_and_0x80_in_v311(secured: GatewayProcess, level: int) -> None:
    expected = rc.NOT_AUTHORIZED if level == pk.MQTT_5 else 0x80
    client = RawClient(secured.port, level)
    try:
        assert client.connect(unique("sub"), username="alice", password=b"wonderland").reason_code == 0
        client.send(pk.Subscribe(1, [pk.SubscribeRequest("bob/#", 1), pk.SubscribeRequest("alice/x", 1)]))
        assert client.expect(pk.Suback).reason_codes == [expected, 1]
    finally:
        client.close()


def test_denied_publish_gets_puback_0x87_in_v5_and_is_dropped_in_v311(secured: GatewayProcess, level: int) -> None:
    """3.1.1's PUBACK has no reason code: the forbidden message is acknowledged and dropped."""
    watcher = RawClient(secured.port, level)
    watcher.connect(unique("bob"), username="bob", password=b"builder")
    watcher.subscribe("#", 1)
    client = RawClient(secured.port, level)
    try:
        client.connect(unique("alice"), username="alice", password=b"wonderland")
        client.send(pk.Publish("bob/inbox", b"forbidden", 1, packet_id=1))
        assert client.expect(pk.PubAck).reason_code == (rc.NOT_AUTHORIZED if level == pk.MQTT_5 else 0)
        client.send(pk.Publish("public/alice", b"allowed", 1, packet_id=2))
        assert client.expect(pk.PubAck).reason_code == 0
        publish = watcher.expect(pk.Publish)
        assert publish.payload == b"allowed"  # the forbidden one never arrived before it
        watcher.send(pk.PubAck(publish.packet_id))
    finally:
        client.close()
        watcher.close()


def test_deliveries_are_filtered_by_read_rules(secured: GatewayProcess, level: int) -> None:
    alice = paho_as(secured, level, "alice", "wonderland")
    bob = paho_as(secured, level, "bob", "builder")
    try:
        alice.connect()
        granted = alice.subscribe("alice/#", 1)[0]
        assert (granted.value if level == pk.MQTT_5 else granted) == 1  # paho gives 3.1.1's as an int
        bob.connect()
        bob.subscribe("#", 1)
        alice.publish("alice/notes", b"mine", 1)
        assert bob.get().payload == b"mine"  # bob may read everything
        assert alice.get().payload == b"mine"
    finally:
        alice.disconnect()
        bob.disconnect()


def test_mosquitto_pub_with_credentials(secured: GatewayProcess, level: int) -> None:
    bob = paho_as(secured, level, "bob", "builder")
    try:
        bob.connect()
        bob.subscribe("alice/#", 1)
        version = "mqttv5" if level == pk.MQTT_5 else "mqttv311"
        common = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(secured.port), "-t", "alice/cli", "-q", "1", "-V", version]
        ok = subprocess.run(common + ["-u", "alice", "-P", "wonderland", "-m", "hi"], capture_output=True, timeout=10)
        assert ok.returncode == 0, ok.stderr
        assert bob.get().payload == b"hi"
        bad = subprocess.run(common + ["-u", "alice", "-P", "nope", "-m", "no"], capture_output=True, timeout=10)
        assert bad.returncode != 0
    finally:
        bob.disconnect()


def test_sighup_reloads_the_password_file(secured: GatewayProcess, tmp_path: Path) -> None:
    """Version-free: what is reloaded is the password file; the login check is the one above, both versions."""
    password_file = Path(secured.config.read_text().split('password_file = "')[1].split('"')[0])  # type: ignore[union-attr]
    client = RawClient(secured.port)
    try:
        assert client.connect(unique("carol"), username="carol", password=b"c4r0l").reason_code != 0
    finally:
        client.close()
    add_user(password_file, "carol", "c4r0l")
    before = secured.output().count("reloaded")
    secured.signal(signal.SIGHUP)
    secured.wait_for_log("reloaded" if before == 0 else rf"(?s)(reloaded.*){{{before + 1}}}")
    client = RawClient(secured.port)
    try:
        assert client.connect(unique("carol"), username="carol", password=b"c4r0l").reason_code == 0
    finally:
        client.close()
