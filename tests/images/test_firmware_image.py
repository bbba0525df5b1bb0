"""images/firmware/build.py: the .mpy bundle, its manifest, booting it alone (heap, safe boot)."""

import hashlib
import json
import subprocess
import sys
import zipfile

import pytest

from testing.processes import GatewayProcess
from tests.device_firmware.micropython import FIRMWARE, MICROPYTHON, ROOT
from tests.device_firmware.thermostat_rig import longest_name, start_thermostat, thermostat_config

BUILD = ROOT / "images" / "firmware" / "build.py"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, str(BUILD), "--out", str(out)], capture_output=True, text=True, check=True)
    return out / proc.stdout.strip().rsplit("/", 1)[-1]


def test_bundle_is_versioned_and_its_manifest_is_true(bundle):
    version = json.loads(zipfile.ZipFile(bundle).read("manifest.json"))["version"]
    assert bundle.name == f"thermostat-fw-{version}.zip"
    assert f'VERSION = "{version}"' in (FIRMWARE / "thermostat.py").read_text()
    with zipfile.ZipFile(bundle) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        names = set(archive.namelist())
        assert names == {e["path"] for e in manifest["files"]} | {"manifest.json"}
        for entry in manifest["files"]:
            data = archive.read(entry["path"])
            assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"], entry["sha256"])
        template = json.loads(archive.read(manifest["config_template"]))
    assert {p.stem + ".mpy" for p in FIRMWARE.glob("*.py")} == {n for n in names if n.endswith(".mpy")}
    assert not [n for n in names if n.endswith(".py")]
    assert set(template) >= {"thermostat", "broker", "set_point", "timing", "hardware"}
    # The bundle's bytecode version is the one this interpreter loads.
    implementation = subprocess.run([str(MICROPYTHON), "-c", "import sys; print(sys.implementation._mpy & 0xff)"],
                                    capture_output=True, text=True, check=True).stdout
    assert manifest["mpy_version"] == int(implementation)


def test_build_is_reproducible(bundle, tmp_path):
    subprocess.run([sys.executable, str(BUILD), "--out", str(tmp_path)], capture_output=True, check=True)
    assert (tmp_path / bundle.name).read_bytes() == bundle.read_bytes()


def test_another_version_is_built_with_version_and_the_firmware_in_it_says_so(bundle, tmp_path):
    proc = subprocess.run([sys.executable, str(BUILD), "--out", str(tmp_path), "--version", "9.8.7-rc1"],
                          capture_output=True, text=True, check=True)
    built = tmp_path / "thermostat-fw-9.8.7-rc1.zip"
    assert proc.stdout.strip() == str(built)
    with zipfile.ZipFile(built) as archive:
        assert json.loads(archive.read("manifest.json"))["version"] == "9.8.7-rc1"
        assert b"9.8.7-rc1" in archive.read("thermostat.mpy")  # what the firmware reports as its fw
    assert 'VERSION = "9.8.7-rc1"' not in (FIRMWARE / "thermostat.py").read_text()  # the sources are untouched
    refused = subprocess.run([sys.executable, str(BUILD), "--out", str(tmp_path), "--version", "../x"],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "not 1-32" in refused.stderr
    assert "--version" in subprocess.run([sys.executable, str(BUILD), "--help"], capture_output=True, text=True).stdout


def test_bundle_boots_from_mpy_alone_within_64k_of_heap(bundle, tmp_path, mosquitto, micropython, paho_peer):
    code = tmp_path / "flash"
    with zipfile.ZipFile(bundle) as archive:
        archive.extractall(code)
    assert not list(code.glob("*.py"))
    peer = paho_peer(mosquitto.host, mosquitto.port)
    peer.subscribe("devices/t-mpy/messages/events/data")
    config = thermostat_config("t-mpy", mosquitto.host, mosquitto.port)
    fw = start_thermostat(micropython, code, config, code_dir=code, heap="64K")
    fw.expect(r"^thermostat t-mpy starting$")
    fw.expect(r"^relay on$")
    fw.expect(r"^connected$")
    # The proof is the cap: with -X heapsize=64K a run needing more would die of MemoryError.
    peaks = [peer.next_json("/data")["mem_peak"] for _ in range(5)]
    assert fw.process.poll() is None and "MemoryError" not in fw.output(), fw.output()
    assert 10_000 < max(peaks) <= 65536, peaks


def unpacked(bundle, into):
    with zipfile.ZipFile(bundle) as archive:
        archive.extractall(into)
    assert not list(into.glob("*.py"))
    return into


@pytest.mark.parametrize("name", ["t-heap", longest_name("t-heap")], ids=["short-name", "longest-name"])
def test_after_registration_16k_of_the_64k_heap_stay_free_with_a_4k_block(bundle, tmp_path, micropython, paho_peer, name):
    """Issue 15's bound, with the longest name deploy.py accepts too: the name is in strings kept for the run."""
    code = unpacked(bundle, tmp_path / "flash")
    with GatewayProcess(tmp_path / "gateway") as gateway:
        peer = paho_peer(gateway.host, gateway.port)
        peer.subscribe(f"devices/{name}/messages/events/data")
        fw = start_thermostat(micropython, code, thermostat_config(name, gateway.host, gateway.port),
                              code_dir=code, heap="64K")
        fw.expect(rf"^registered {name}\\setPoint$")
        samples = []
        while len(samples) < 5:
            data = peer.next_json("/data")
            if data["registered"]:
                samples.append((data["mem_free"], data["mem_largest"]))
    assert "MemoryError" not in fw.output(), fw.output()
    print(f"heap after registration ({len(name)}-character name; free, largest block):", samples)
    assert min(free for free, _ in samples) >= 16 * 1024, samples
    assert min(largest for _, largest in samples) >= 4 * 1024, samples


def test_safe_boot_file_holds_the_app_before_anything_is_armed(bundle, tmp_path, micropython):
    code = unpacked(bundle, tmp_path / "flash")
    (code / "SAFE_BOOT").write_text("")
    fw = start_thermostat(micropython, code, thermostat_config("t-safe", "127.0.0.1", 9), code_dir=code, heap="64K")
    assert fw.wait(10) == 0
    assert fw.lines[:1] == ["safe boot: SAFE_BOOT present, thermostat not started"], fw.output()
    (code / "SAFE_BOOT").unlink()
    fw = start_thermostat(micropython, code, thermostat_config("t-safe", "127.0.0.1", 9), code_dir=code, heap="64K")
    fw.expect(r"^thermostat t-safe starting$")
