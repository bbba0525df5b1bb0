"""What the image tests check through a booted gateway's MQTT port, written once for every way of booting it.

``test_nspawn_boot.py`` (the native root under systemd-nspawn), ``test_qemu_boot.py`` and
``test_qemu_update.py`` (the arm64 disk image under QEMU) reach the gateway through a host port and log in
with the account first-boot provisioning took from the boot partition. They share:

* the provisioning files a technician puts on the boot partition (``appliance.toml``, ``appliance-passwd``);
* an MQTT QoS 1 round trip with that account;
* the power cut: acknowledged QoS 1 publishes queued for an offline durable session and ``+OK`` SETs
  before it (:func:`acknowledge_before_power_cut`), all of them there after the next boot
  (:func:`assert_nothing_acknowledged_was_lost`).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.statestore.client.blocking import StateStoreClient
from testing import paho_clients

PROJECT = Path(__file__).resolve().parents[2]
#: The device account the tests provision and log in with.
USER, PASSWORD = "tester", "s3cret-pass"
#: Acknowledged before the power cut, checked after it.
CUT_PUBLISHES, CUT_SETS = 50, 20


def write_timings(timings: dict[str, float], path: Path, append: bool = False) -> None:
    """The measured seconds, printed and written to ``path`` (``build/...``) for the README's figures."""
    text = "".join(f"{name}: {seconds:.1f} s\n" for name, seconds in timings.items())
    print("\n" + text, end="")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w") as out:
        out.write(text)


def write_provisioning(directory: Path, gateway_id: str) -> list[Path]:
    """``appliance.toml`` (the gateway's id) and ``appliance-passwd`` (``USER``) in ``directory``, as a
    technician writes them onto the boot partition. Returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    config, passwd = directory / "appliance.toml", directory / "appliance-passwd"
    config.write_text(f'[gateway]\nid = "{gateway_id}"\n')
    subprocess.run([sys.executable, "-m", "appliance", "passwd", "-c", "-b", str(passwd), USER, PASSWORD], check=True, cwd=PROJECT)
    return [config, passwd]


def state_store(port: int, client_id: str, timeout: float) -> StateStoreClient:
    return StateStoreClient("127.0.0.1", port, client_id, username=USER, password=PASSWORD, timeout=timeout)


def round_trip(port: int, topic: str, payload: bytes, timeout: float) -> bool:
    """A QoS 1 publish that comes back to the same client's subscription, with the provisioned account."""
    received: list[bytes] = []
    arrived, subscribed = threading.Event(), threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"host-{topic.replace('/', '-')}", protocol=mqtt.MQTTv5)
    client.username_pw_set(USER, PASSWORD)

    def on_message(_client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage) -> None:
        received.append(bytes(message.payload))
        arrived.set()

    client.on_message = on_message
    client.on_subscribe = lambda *_: subscribed.set()
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        if not subscribed.wait(timeout):
            return False
        client.publish(topic, payload, qos=1).wait_for_publish(timeout)
        return arrived.wait(timeout) and received == [payload]
    finally:
        paho_clients.close(client)


def durable_subscriber(port: int, timeout: float, on_message: Callable[..., None] | None = None) -> mqtt.Client:
    """A client whose session outlives its connection (and, the broker being durable, a power cut)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="keeper", protocol=mqtt.MQTTv5)
    client.username_pw_set(USER, PASSWORD)
    if on_message is not None:
        client.on_message = on_message
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    connected = threading.Event()
    client.on_connect = lambda *_: connected.set()
    client.connect("127.0.0.1", port, clean_start=False, properties=properties)
    client.loop_start()
    if not connected.wait(timeout):
        paho_clients.close(client)
        raise TimeoutError(f"no CONNACK for the durable subscriber within {timeout} s")
    return client


def acknowledge_before_power_cut(port: int, timeout: float) -> None:
    """``CUT_PUBLISHES`` QoS 1 messages acknowledged (PUBACK) while their durable subscriber is offline,
    and ``CUT_SETS`` state store SETs answered ``+OK``: what the gateway promised to keep."""
    keeper = durable_subscriber(port, timeout)
    subscribed = threading.Event()
    keeper.on_subscribe = lambda *_: subscribed.set()
    keeper.subscribe("cut/#", qos=1)
    try:
        assert subscribed.wait(timeout)
    finally:
        paho_clients.close(keeper)  # offline: what is published now is queued in its durable session
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cut-publisher", protocol=mqtt.MQTTv5)
    publisher.username_pw_set(USER, PASSWORD)
    publisher.connect("127.0.0.1", port)
    publisher.loop_start()
    try:
        for n in range(CUT_PUBLISHES):
            info = publisher.publish(f"cut/{n}", b"%d" % n, qos=1)
            info.wait_for_publish(timeout)
            assert info.is_published() and info.rc == mqtt.MQTT_ERR_SUCCESS
    finally:
        paho_clients.close(publisher)
    with state_store(port, "cut-statestore", timeout) as store:
        for n in range(CUT_SETS):
            assert store.set(b"cut-%d" % n, b"value-%d" % n).applied  # +OK: acknowledged


def assert_nothing_acknowledged_was_lost(port: int, timeout: float) -> None:
    """After the power cut and a new boot: every acknowledged message reaches the durable subscriber,
    every SET reads back."""
    received: dict[str, bytes] = {}
    all_back = threading.Event()

    def on_message(_client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage) -> None:
        received[message.topic] = bytes(message.payload)
        if len(received) == CUT_PUBLISHES:
            all_back.set()

    keeper = durable_subscriber(port, timeout, on_message)
    try:
        assert all_back.wait(timeout), sorted(received)
    finally:
        paho_clients.close(keeper)
    assert received == {f"cut/{n}": b"%d" % n for n in range(CUT_PUBLISHES)}
    with state_store(port, "cut-check", timeout) as store:
        assert [store.get(b"cut-%d" % n).value for n in range(CUT_SETS)] == [b"value-%d" % n for n in range(CUT_SETS)]
