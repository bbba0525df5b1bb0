"""The image's own configuration on a machine without its hardware: a real ``appliance run`` with the
shipped ``gateway.toml`` (GPIO panel and modem enabled) where gpiozero finds no pin library and the modem's
port does not exist. The gateway must serve anyway - broker, state store, forwarding - say once what is
missing, show it on the metrics page and in ``appliance doctor``, and take the modem up when its port
appears."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from gpiozero.pins.mock import MockFactory

from appliance.doctor import Finding, Verdict, check_gpio
from appliance.hardware.config import GpioConfig
from appliance.hardware.gpio import GpioUnavailable, pin_library
from appliance.statestore.client.blocking import StateStoreClient
from testing.collector import Collector
from testing.device import Device as PeerDevice
from testing.processes import ROOT, GatewayProcess, MosquittoProcess
from testing.waiting import wait_until
from tests.forwarding.rig import manifest
from tests.hardware.modem_emulator import ModemEmulator

SHIPPED_CONFIG = ROOT / "images/gateway/rootfs/etc/appliance/gateway.toml"


def no_gpio_here() -> bool:
    try:
        pin_library()
    except GpioUnavailable:
        return True
    return False


def metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


@pytest.mark.skipif(not no_gpio_here(), reason="this machine has GPIO: the test needs one without")
def test_the_shipped_config_serves_without_gpio_and_modem_and_takes_the_modem_up_when_it_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tomllib.loads(SHIPPED_CONFIG.read_text())
    assert config["hardware"]["gpio"]["enabled"] and config["hardware"]["modem"]["enabled"]
    modem_port = tmp_path / "ttyUSB2"
    # Only what a test machine needs changed: its own data dir, metrics, anonymous clients, the modem's
    # path and a short poll; a forwarding route to a local "cloud" broker.
    config["gateway"].update(data_dir=str(tmp_path / "data"), metrics_port=0)
    config["broker"]["auth"] = {"allow_anonymous": True}
    config["hardware"]["modem"].update(port=str(modem_port), poll_interval=0.2, command_timeout=0.5)
    cloud_broker = MosquittoProcess(tmp_path / "cloud").start()
    (tmp_path / "manifest.json").write_text(manifest({"all": "FROM /messages/* INTO $upstream"}))
    config["forwarding"] = {
        "enabled": True, "manifest": "manifest.json",
        "upstream": {"host": cloud_broker.host, "port": cloud_broker.port, "backoff_min_s": 0.2, "backoff_max_s": 1},
    }
    config_file = tmp_path / "gateway.json"
    config_file.write_text(json.dumps(config))
    monkeypatch.delenv("GPIOZERO_PIN_FACTORY", raising=False)  # gpiozero's own search, as on the device
    gateway = GatewayProcess(tmp_path / "data", config=config_file)
    emulator = ModemEmulator().start()
    cloud = device = None
    try:
        gateway.start()
        metrics_url = gateway.wait_for_log(r"metrics on (http://\S+)").group(1)
        page = metrics(metrics_url)
        assert 'appliance_hardware_available{part="gpio"} 0' in page
        assert 'appliance_hardware_available{part="modem"} 0' in page

        with StateStoreClient("127.0.0.1", gateway.port, "operator", timeout=10) as store:
            assert store.set(b"setpoint", b"21.5").applied
            assert store.get(b"setpoint").value == b"21.5"

        cloud = Collector(cloud_broker.host, cloud_broker.port, "gateways/#")
        device = PeerDevice("127.0.0.1", gateway.port, "t1")
        assert device.publish("data", b"x", {"n": "0"}) == 0
        assert [received.n for received in cloud.wait_for(1)] == [0]  # no modem: forwarding is not held back

        doctor = subprocess.run(
            [sys.executable, "-m", "appliance", "doctor", "--config", str(config_file)],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )
        assert doctor.returncode == 1
        gpio_lines = [line for line in doctor.stdout.splitlines() if line.split()[1:2] == ["gpio"]]
        assert len(gpio_lines) == 1 and gpio_lines[0].startswith("PROBLEM") and "without LEDs" in gpio_lines[0], doctor.stdout

        modem_port.symlink_to(emulator.port)  # the USB modem enumerates late
        wait_until(
            lambda: 'appliance_hardware_available{part="modem"} 1' in (page := metrics(metrics_url))
            and "appliance_modem_registered 1\n" in page,
            timeout=10, what=lambda: metrics(metrics_url),
        )
        assert gateway.terminate() == 0
        output = gateway.output()
        assert output.count("GPIO not available") == 1, output
        assert output.count(f"modem port {modem_port} does not open") == 1, output
        assert "Traceback" not in output, output
    finally:
        for peer in (device, cloud):
            if peer is not None:
                peer.close()
        gateway.kill9()
        emulator.close()
        cloud_broker.stop()


def test_doctor_names_the_pin_library_where_there_is_one(factory: MockFactory) -> None:
    assert check_gpio(GpioConfig(enabled=True, button=23)) == Finding("gpio", Verdict.OK, "GPIO pins through MockFactory")
    assert check_gpio(GpioConfig()) == Finding("gpio", Verdict.OK, "no GPIO configured")
