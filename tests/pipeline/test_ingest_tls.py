"""The ingest reaches the cloud broker the way mosquitto_sub does on the internet: TLS (a CA file, a client
certificate and key) and a user name and password. A real mosquitto with a TLS listener that requires
client certificates signed by its CA and a password file; the certificates are made with ``cryptography``.
"""

import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from pipeline.envelope import Incoming
from pipeline.ingest import Ingest, IngestConfig
from pipeline.landing import read_records
from testing.certificates import ca_signed_pair
from testing.processes import MosquittoProcess, free_port, password_file
from tests.pipeline.pipeline_data import reading
from tests.pipeline.test_ingest import Running

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "cloud-secret"


@dataclass
class Cloud:
    port: int
    files: dict[str, Path]

    def tls_options(self, **overrides: object) -> dict[str, object]:
        options: dict[str, object] = {"username": "ingest", "password": PASSWORD, "cafile": str(self.files["ca"]),
                                      "certfile": str(self.files["client"]), "keyfile": str(self.files["client_key"])}
        options.update(overrides)
        return options


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed (make test installs it)")
    # mosquitto drops root privileges before it reads its files: not from pytest's private tmp dir.
    readable = Path(tempfile.mkdtemp(prefix="ingest-tls-"))
    readable.chmod(0o755)
    try:
        files = ca_signed_pair(readable)
        passwords = readable / "passwd"
        password_file(passwords, {"ingest": PASSWORD})
        passwords.chmod(0o644)
        tls_port = free_port()
        config = (f"allow_anonymous false\npassword_file {passwords}\n"
                  f"listener {tls_port} 127.0.0.1\ncafile {files['ca']}\ncertfile {files['server']}\n"
                  f"keyfile {files['server_key']}\nrequire_certificate true\n")
        with MosquittoProcess(readable / "broker", extra_config=config):
            yield Cloud(tls_port, files)
    finally:
        shutil.rmtree(readable, ignore_errors=True)


def publish_over_tls(cloud: Cloud, message: Incoming) -> None:
    """The gateway's side: it too needs the CA, a client certificate and the password."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="gateway-tls", protocol=mqtt.MQTTv5)
    client.username_pw_set("ingest", PASSWORD)
    client.tls_set(ca_certs=str(cloud.files["ca"]), certfile=str(cloud.files["client"]),
                   keyfile=str(cloud.files["client_key"]))
    client.connect("127.0.0.1", cloud.port)
    client.loop_start()
    try:
        properties = Properties(PacketTypes.PUBLISH)
        properties.UserProperty = list(message.user_properties)
        properties.ContentType = message.content_type
        client.publish(message.topic, message.payload, qos=1, properties=properties).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()


def test_the_ingest_lands_messages_from_a_tls_broker_that_requires_a_client_certificate(cloud: Cloud, tmp_path: Path) -> None:
    running = Running(("127.0.0.1", cloud.port), tmp_path, **cloud.tls_options())
    try:
        message = reading("gw1", "t1", 7, 0, 20.0, 20.5, False)
        publish_over_tls(cloud, message)
        running.wait_for(1)
    finally:
        stats = running.stop()
    assert stats.landed["events"] == 1
    (event,) = read_records(tmp_path, "events")
    assert event["message_id"] == "gw1:7" and event["payload"] == message.payload.decode()


@pytest.mark.parametrize("missing", ["client certificate", "password"])
def test_without_the_client_certificate_or_the_password_the_ingest_does_not_get_in(
        cloud: Cloud, tmp_path: Path, missing: str) -> None:
    options = (cloud.tls_options(certfile=None, keyfile=None) if missing == "client certificate"
               else cloud.tls_options(password="wrong"))
    ingest = Ingest(IngestConfig(host="127.0.0.1", port=cloud.port, landing=str(tmp_path), **options))
    stop = threading.Event()
    thread = threading.Thread(target=ingest.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert not ingest.ready.wait(3), f"subscribed without the {missing}"
        # Refused again and again, it waits longer each time (0.2 s, 0.4 s, ...): it was 1,700 TLS
        # handshakes in these 3 s without the certificate (the broker takes the connection, then drops it).
        assert ingest.stats.reconnects <= 4
    finally:
        stop.set()
        thread.join(10)


def test_the_command_line_takes_tls_and_the_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.ingest
    from pipeline.cli import main

    configs: list[IngestConfig] = []
    monkeypatch.setattr(pipeline.ingest, "run_ingest", lambda config: configs.append(config) or 0)
    monkeypatch.setenv("PIPELINE_MQTT_PASSWORD", "from-env")
    main(["ingest", "--landing", "x", "--host", "cloud.example", "--port", "8883", "--cafile", "ca.pem",
          "--cert", "c.pem", "--key", "c.key", "-u", "ingest"])
    main(["ingest", "--landing", "x", "--tls", "-P", "typed"])
    certified, system_cas = configs
    assert (certified.cafile, certified.certfile, certified.keyfile) == ("ca.pem", "c.pem", "c.key")
    assert (certified.username, certified.password, certified.port) == ("ingest", "from-env", 8883)
    assert system_cas.tls and system_cas.cafile is None and system_cas.password == "typed"
