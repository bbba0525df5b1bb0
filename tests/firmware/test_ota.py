"""Over-the-air updates end to end: thermostats booted from their .mpy bundle under a 64 KB heap, our
gateway (`python -m appliance run`) serving bundles published with `appliance firmware publish`.

The board resets for real (tests/firmware/ota_rig.py: exit status 3 starts micropython again in the same
flash directory), so the switch, the trial boot and the rollback run the code a board runs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from appliance.statestore.client import StateStoreClient
from testing.processes import GatewayProcess
from testing.waiting import wait_until
from tests.device_firmware.micropython import FIRMWARE, ROOT
from tests.device_firmware.thermostat_rig import longest_name
from tests.firmware.ota_rig import ResettingBoard, build_variant, publish

OLD = "0.1.0"  # device_firmware's VERSION: what the boards are deployed with
# The heap every board here runs in: the 64 KB the issue judges. The updater fits it because it runs at
# boot instead of the thermostat, not beside it (docs/firmware.md, "Over-the-air updates").
OTA_HEAP = "64K"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles")
    return {
        OLD: build_variant(FIRMWARE, out, OLD),
        "0.2.0": build_variant(FIRMWARE, out, "0.2.0"),
        "0.3.0": build_variant(FIRMWARE, out, "0.3.0"),
        "0.3.0-crash": build_variant(FIRMWARE, out, "0.3.0-crash", 'raise RuntimeError("broken at boot")\n'),
        "0.3.0-hang": build_variant(FIRMWARE, out, "0.3.0-hang", 'print("hanging")\nimport time\ntime.sleep(600)\n'),
    }


@pytest.fixture
def gateway(tmp_path):
    gw = GatewayProcess(tmp_path / "gateway").start()
    yield gw
    gw.kill9()


@pytest.fixture
def boards(tmp_path, gateway, bundles):
    started: list[ResettingBoard] = []

    def start(name: str, heap: str = OTA_HEAP, **config) -> ResettingBoard:
        board = ResettingBoard(tmp_path / name, bundles[OLD], name, gateway.host, gateway.port, heap, **config)
        started.append(board)
        board.expect(rf"^registered {name}\\setPoint$", timeout=30)
        return board

    yield start
    for board in started:
        board.stop()


def telemetry_while(peer, name: str, until, timeout: float = 60.0) -> list[dict]:
    """Telemetry of one thermostat until `until(data)` is true: its readings (output `data`) and, while
    its updater runs, the updater's status (output `update`)."""
    seen = []
    deadline = time.monotonic() + timeout
    outputs = (f"devices/{name}/messages/events/data", f"devices/{name}/messages/events/update")
    while True:
        msg = peer.next(timeout=max(0.1, deadline - time.monotonic()))
        if msg.topic not in outputs:
            continue
        data = json.loads(msg.payload)
        data["_output"] = msg.topic.rsplit("/", 1)[1]  # which output it came on
        seen.append(data)
        if until(data):
            return seen


def test_an_update_is_fetched_verified_switched_to_and_accepted(gateway, boards, bundles, paho_peer):
    board = boards("t-ota")
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe("devices/t-ota/messages/events/+", 0)
    with StateStoreClient(gateway.host, gateway.port, client_id="op-ota", timeout=10) as store:
        assert store.set("t-ota\\setPoint", b"22.5").applied
        board.expect(r"^set point 22.5 from notify$")
        started = time.monotonic()
        out = publish(gateway, str(bundles["0.2.0"]), "--target", "t-ota")
        assert out[0]["stored"] == "0.2.0" and out[1] == {"key": "t-ota\\desiredFirmware", "version": "0.2.0", "applied": True}
        mark, _ = board.expect(r"^update: fetching 0\.2\.0$")
        # Written while the updater runs: the thermostat applies it right after, from its GET at boot (or from
        # KEYNOTIFY if the update was over before the write arrived).
        assert store.set("t-ota\\setPoint", b"24").applied
        written = time.monotonic()
        index, _ = board.expect(r"^set point 24.0 from (get|notify)$", after=mark, timeout=30)
    print(f"set point written during the update applied {board.times[index] - written:.2f} s later: {board.lines[index]}")
    seen = telemetry_while(peer, "t-ota", lambda d: d["fw"] == "0.2.0" and d["registered"])
    took = time.monotonic() - started
    board.expect(r"^update: 0\.2\.0 verified \(\d+ files\), restarting$")
    board.expect(r"^firmware 0\.2\.0 accepted$")
    assert board.pointer() == "0.2.0 - - - fw/a -"  # on 0.2.0 in fw/a, accepted; the deployed version is the way back
    during = [d for d in seen if (d.get("update") or {}).get("state") == "downloading"]
    assert during, seen
    # The updater's status is no reading: its own output; every reading on `data` has its time.
    assert {d["_output"] for d in during} == {"update"}, during
    assert all("ts_ms" in d for d in seen if d["_output"] == "data"), seen
    assert {d["set_point"] for d in during} == {22.5}, during  # the updater holds the last good set point
    free, largest = min(d["mem_free"] for d in during), min(d["mem_largest"] for d in during)
    peak = max(d["mem_peak"] for d in during)
    print(f"update of one thermostat: {took:.1f} s; heap during it (64 KB): free >= {free} B, largest block >= {largest} B,"
          f" peak in use {peak} B")
    # The updater runs alone, its 4 KB receive buffer included, and keeps room for the signature check
    # (p256.py: about 9 KB of big integers that come and go).
    assert free >= 12 * 1024 and largest >= 4 * 1024 and peak < 60 * 1024, during
    assert seen[-1]["update"] is None and "MemoryError" not in board.output() and "fault" not in board.output()


def test_an_updated_board_updates_again_within_the_64k_heap(gateway, boards, bundles, paho_peer):
    """The second update runs on an updated board, and the board it leaves keeps the heap of a fresh one:
    16 KB free and a 4 KB block after registration (issue 15) on every boot, its trial boot too, with the
    modules in fw/b and the accepted form of main.py (docs/firmware.md, OTA, Heap). The board has the
    longest name deploy.py accepts: the name is in strings kept for the run."""
    name = longest_name("t-twice")
    board = boards(name)
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe(f"devices/{name}/messages/events/+", 0)
    publish(gateway, str(bundles["0.2.0"]), "--target", name)
    board.expect(r"^firmware 0\.2\.0 accepted$", timeout=60)
    publish(gateway, str(bundles["0.3.0"]), "--target", name)
    trial = telemetry_while(peer, name, lambda d: d["fw"] == "0.3.0" and d["registered"])[-1]
    board.expect(r"^firmware 0\.3\.0 accepted$", timeout=60)
    accepted = telemetry_while(peer, name, lambda d: d["fw"] == "0.3.0" and d["registered"])[-1]
    assert board.pointer() == "0.3.0 0.2.0 - - fw/b fw/a"  # 0.2.0 in fw/a is the way back now
    assert sorted(p.name for p in (board.flash / "fw").iterdir()) == ["a", "b"]
    # thermostat, updater, 0.2.0 on trial, 0.2.0 accepted, updater, 0.3.0 on trial, 0.3.0 accepted
    assert board.boots == 7
    assert (board.flash / "main.py").read_text().endswith('import sys\nsys.path.insert(0, "fw/b")\nimport app\n')
    # And as the board boots from now on.
    board.power_cycle()
    mark, _ = board.expect(r"^<boot 8>$")
    board.expect(rf"^registered {name}\\setPoint$", after=mark, timeout=30)
    later = telemetry_while(peer, name, lambda d: d["registered"] and d["ts_ms"] > accepted["ts_ms"] + 2000)
    steady = [accepted] + [d for d in later if d["registered"] and d["ts_ms"] > accepted["ts_ms"]]
    print("heap on an updated board after registration (on trial; accepted, then after a power cut):",
          trial["mem_free"], trial["mem_largest"], [(d["mem_free"], d["mem_largest"]) for d in steady])
    assert min(d["mem_free"] for d in steady) >= 16 * 1024 and min(d["mem_largest"] for d in steady) >= 4 * 1024
    # The trial boot lasts until its first telemetry (then the board resets into the accepted form):
    # its main.py's rename, mark and handler cost about 350 B more. Figures: docs/firmware.md, OTA, Heap.
    assert trial["mem_free"] >= 16 * 1024 and trial["mem_largest"] >= 4 * 1024, trial
    assert "MemoryError" not in board.output() and "Traceback" not in board.output(), board.output()


def test_a_version_wanted_while_the_new_one_is_on_trial_is_installed_once_it_is_accepted(gateway, boards, bundles):
    board = boards("t-trial")
    publish(gateway, str(bundles["0.3.0"]))  # stored, wanted by nobody yet
    publish(gateway, str(bundles["0.2.0"]), "--target", "t-trial")
    mark, _ = board.expect(r"^update: 0\.2\.0 verified")
    with StateStoreClient(gateway.host, gateway.port, client_id="op-trial", timeout=10) as store:
        assert store.set("t-trial\\desiredFirmware", b"0.3.0").applied  # while 0.2.0 boots on trial
    board.expect(r"^firmware 0\.2\.0 accepted$", after=mark, timeout=60)  # not rolled back by a restart on trial
    board.expect(r"^firmware 0\.3\.0 accepted$", after=mark, timeout=60)
    assert "rolled back" not in board.output(), board.output()


def key_file(path: Path) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def public_key(gateway, key: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "appliance", "firmware", "public-key", str(key)],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(proc.stdout)["key"]


def test_a_signed_manifest_is_verified_on_the_device_and_one_signed_by_another_key_is_refused(
        tmp_path, gateway, boards, bundles, paho_peer):
    ours, theirs = key_file(tmp_path / "ours.pem"), key_file(tmp_path / "theirs.pem")
    update = {"key": public_key(gateway, ours)}
    forged = boards("t-forged", update=update)
    signed = boards("t-signed", update=update)
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe("devices/+/messages/events/+", 0)
    out = publish(gateway, str(bundles["0.2.0"]), "--key", str(theirs), "--target", "t-forged")
    assert out[0]["signed"] is True
    forged.expect(r"^update: refused 0\.2\.0: manifest signature does not verify$", timeout=30)
    assert forged.pointer() is None
    # Publishing it again with our key is refused: a version's signature never changes through publish.
    again = subprocess.run([sys.executable, "-m", "appliance", "firmware", "publish", str(bundles["0.2.0"]), "--key",
                            str(ours), "--data-dir", str(gateway.data_dir), "--port", str(gateway.port)],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert again.returncode == 1 and "never changes" in again.stderr
    # Replacing it is a deliberate command of its own; then the other thermostat is pointed at it.
    subprocess.run([sys.executable, "-m", "appliance", "firmware", "sign", "0.2.0", "--key", str(ours),
                    "--data-dir", str(gateway.data_dir)], check=True, capture_output=True, timeout=60, cwd=ROOT)
    publish(gateway, "--version", "0.2.0", "--target", "t-signed")
    signed.expect(r"^firmware 0\.2\.0 accepted$", timeout=60)
    status = subprocess.run([sys.executable, "-m", "appliance", "firmware", "status", "--wait", "1.5",
                             "--data-dir", str(gateway.data_dir), "--host", gateway.host, "--port", str(gateway.port)],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = [json.loads(line) for line in status.stdout.splitlines()]
    assert lines[0] == {"stored": ["0.2.0"]}
    by_device = {line["device"]: line for line in lines[1:]}
    assert (by_device["t-signed"]["running"], by_device["t-signed"]["desired"]) == ("0.2.0", "0.2.0"), lines
    assert by_device["t-forged"]["running"] == OLD and by_device["t-forged"]["update"]["state"] == "refused", lines


def test_a_file_that_does_not_match_its_sha256_is_refused_and_the_old_version_keeps_running(
        gateway, boards, bundles, paho_peer):
    board = boards("t-bad-sha")
    publish(gateway, str(bundles["0.2.0"]))
    damaged = gateway.data_dir / "firmware" / "0.2.0" / "thermostat.mpy"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe("devices/t-bad-sha/messages/events/+", 0)
    publish(gateway, "--version", "0.2.0", "--target", "t-bad-sha")
    board.expect(r"^update: refused 0\.2\.0: thermostat\.mpy: sha256 does not match the manifest$", timeout=30)
    data = telemetry_while(peer, "t-bad-sha", lambda d: (d.get("update") or {}).get("state") == "refused")[-1]
    assert data["fw"] == OLD and data["registered"]
    assert data["update"]["reason"] == "thermostat.mpy: sha256 does not match the manifest"
    assert board.pointer() is None and board.boots == 3  # the thermostat, the updater, the thermostat: no loop
    assert not (board.flash / "fw" / "a").exists()  # bad data is not kept


def test_an_update_whose_app_crashes_at_boot_is_rolled_back(gateway, boards, bundles, paho_peer):
    """The board it rolls back to keeps issue 15's heap, with the update record read and the longest name."""
    name = longest_name("t-crash")
    board = boards(name)
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe(f"devices/{name}/messages/events/+", 0)
    publish(gateway, str(bundles["0.3.0-crash"]), "--target", name)
    board.expect(r"^update: 0\.3\.0-crash verified")
    board.expect(r"^firmware 0\.3\.0-crash rolled back: RuntimeError: broken at boot$", timeout=30)
    fourth, _ = board.expect(r"^<boot 4>$", timeout=30)
    back, _ = board.expect(rf"^registered {name}\\setPoint$", after=fourth, timeout=30)
    data = telemetry_while(peer, name, lambda d: d["fw"] == OLD and (d.get("update") or {}).get("state") == "rolled_back")[-1]
    assert data["update"]["version"] == "0.3.0-crash"
    print("heap after the rollback (update record read):", data["mem_free"], data["mem_largest"])
    assert data["mem_free"] >= 16 * 1024 and data["mem_largest"] >= 4 * 1024, data
    assert board.pointer() == "- - - 0.3.0-crash - -"  # the deployed version, and it will not fetch 0.3.0-crash again
    assert board.boots == 4  # into the updater, the switch, the crash's reset, nothing more: no boot loop
    assert "update: fetching 0.3.0-crash" not in "\n".join(board.lines[back:])
    assert (board.flash / "main.py").read_text() == "import app\n"  # back to the deployed boot: no fwboot


def test_an_update_that_never_reaches_its_first_telemetry_is_rolled_back_at_the_next_boot(gateway, boards, bundles):
    """A version on trial that hangs (on a board the watchdog resets it) or loses power boots no further:
    main.py's trial form is consumed by its first boot, so the next one runs fwboot, which goes back."""
    board = boards("t-hang")
    publish(gateway, str(bundles["0.3.0-hang"]), "--target", "t-hang")
    mark, _ = board.expect(r"^hanging$", timeout=30)  # the trial boot: its app.py sleeps
    assert board.pointer() == "0.3.0-hang - 0 - fw/a -"
    board.power_cycle()
    board.expect(r"^firmware 0\.3\.0-hang rolled back: no telemetry after its trial boot$", after=mark, timeout=30)
    fifth, _ = board.expect(r"^<boot 5>$", timeout=30)  # the rollback resets into the deployed version
    board.expect(r"^registered t-hang\\setPoint$", after=fifth, timeout=30)
    assert board.pointer() == "- - - 0.3.0-hang - -"
    assert (board.flash / "main.py").read_text() == "import app\n"
    assert "update: fetching 0.3.0-hang" not in "\n".join(board.lines[fifth:])  # not fetched again


def test_a_transfer_cut_by_a_gateway_restart_resumes_where_it_stopped(gateway, boards, bundles):
    board = boards("t-resume")
    publish(gateway, str(bundles["0.2.0"]), "--target", "t-resume")
    staging = board.flash / "fw" / "a"
    first = staging / "app.mpy"  # the manifest's first file (sorted): the transfer is under way, 17 files to go
    wait_until(lambda: first.exists(), timeout=30, what="the first file on flash")
    mark = len(board.lines)
    gateway.kill9()
    board.expect(r"^update: connection lost:", after=mark)
    before = first.stat().st_mtime_ns
    gateway.start()
    board.expect(r"^update: connected$", after=mark)  # the same updater, again: not a reboot into it
    board.expect(r"^firmware 0\.2\.0 accepted$", timeout=60)
    board.expect(r"^<boot 4>$")  # accepting resets into the accepted boot: counted after it, not racing it
    # It went on where it was: one run of the updater, files done before the cut not fetched again
    # (thermostat, updater, 0.2.0 on trial, 0.2.0 accepted).
    assert board.output().count("update: fetching 0.2.0") == 1 and board.boots == 4, board.output()
    assert first.stat().st_mtime_ns == before


@pytest.mark.parametrize("cut_after", ["app.mpy", "hlc.mpy"], ids=["first-file", "eighth-file"])
def test_a_transfer_cut_by_a_power_cut_resumes_from_what_is_on_flash(gateway, boards, bundles, paho_peer, cut_after):
    board = boards("t-power")
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe("devices/t-power/messages/events/+", 0)
    publish(gateway, str(bundles["0.2.0"]), "--target", "t-power")
    first = board.flash / "fw" / "a" / "app.mpy"  # the manifest's first file
    cut = board.flash / "fw" / "a" / cut_after  # in the manifest's order (sorted names): the files before it are whole
    wait_until(lambda: cut.exists(), timeout=30, what=f"{cut_after} on flash")
    board.power_cycle()
    board.expect(r"^<boot 3>$")
    # After the reboot the updater runs again: the manifest on flash is the one it verified (its sha256 is in
    # the request), so it is not fetched again; the files already there are checked, not fetched.
    board.expect(r"^update: resuming 0\.2\.0 with the manifest verified before$")
    before = first.stat().st_mtime_ns
    board.expect(r"^firmware 0\.2\.0 accepted$", timeout=60)
    assert board.output().count("update: fetching 0.2.0") == 2 and first.stat().st_mtime_ns == before
    # The resumed updater (files hashed on flash, the manifest taken from it) keeps the documented floor.
    seen = telemetry_while(peer, "t-power", lambda d: d["fw"] == "0.2.0" and d["registered"])
    resumed = [d for d in seen if (d.get("update") or {}).get("state") == "downloading"]  # both runs
    print("heap of the resumed updater:", [(d["mem_free"], d["mem_largest"]) for d in resumed])
    assert resumed and min(d["mem_largest"] for d in resumed) >= 4 * 1024, resumed


@pytest.mark.parametrize("name", ["t-busy", longest_name("t-busy")], ids=["short-name", "longest-name"])
def test_the_first_telemetry_after_a_boot_that_receives_set_points_during_registration_keeps_a_4k_block(
        gateway, boards, paho_peer, name):
    """Set points keep arriving while the thermostat boots and registers (KEYNOTIFY, GET): the handling of
    each leaves garbage in the heap; the first telemetry documents after it must still show the floor."""
    board = boards(name)
    peer = paho_peer(gateway.host, gateway.port)
    topic = f"devices/{name}/messages/events/data"
    peer.subscribe(topic, 0)
    stop = threading.Event()

    def write_set_points() -> None:
        with StateStoreClient(gateway.host, gateway.port, client_id="op-busy", timeout=10) as store:
            value = 20.0
            while not stop.is_set():
                value = 41.0 - value
                store.set(name + "\\setPoint", str(value))
                stop.wait(0.02)

    for boot in (2, 3, 4):
        last = peer.next_json(topic, timeout=10)["seq"]  # the running boot's numbering
        writer = threading.Thread(target=write_set_points, daemon=True)
        writer.start()
        registered: list[dict] = []
        try:
            board.power_cycle()
            mark, _ = board.expect(rf"^<boot {boot}>$")
            board.expect(rf"^registered {name}\\setPoint$", after=mark, timeout=30)
            board.expect(r"^set point .* from notify$", after=mark, timeout=30)
            rebooted = False
            while len(registered) < 3:  # the new boot's first three documents once registered (seq starts again)
                data = peer.next_json(topic, timeout=30)
                rebooted = rebooted or data["seq"] <= last
                last = data["seq"]
                if rebooted and data["registered"]:
                    registered.append(data)
        finally:
            stop.set()
            writer.join(10)
            stop.clear()
        heaps = [(d["seq"], d["mem_free"], d["mem_largest"]) for d in registered]
        print(f"boot {boot}: first telemetry after registration with set points arriving:", heaps)
        assert all(largest >= 4 * 1024 for _, _, largest in heaps), heaps


def fleet_update(gateway, boards, bundles, paho_peer, count: int) -> dict:
    names = [f"t-fl{i:02d}" for i in range(count)]
    fleet = {name: boards(name) for name in names}
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe("devices/+/messages/events/+", 0)
    heap = []
    latencies: list[float] = []
    across_restart: list[float] = []
    started = time.monotonic()
    publish(gateway, str(bundles["0.2.0"]), *[arg for name in names for arg in ("--target", name)])
    value = 20.0
    with StateStoreClient(gateway.host, gateway.port, client_id="fleet-operator", timeout=10) as store:
        pending = set(names)
        # Rounds go on until the whole fleet runs the new version and at least one set point came by
        # notification: when every board restarts within the first round, each of its set points is
        # read at boot ("get") and the notified latencies the bound is about would be none.
        while pending or not latencies:
            assert time.monotonic() - started < 60 * count, f"not updated: {pending}, {len(latencies)} notified"
            # Set points keep coming during the update: each must be applied within its bound.
            value = 21.0 if value == 20.0 else 20.0
            for name in names:
                board = fleet[name]
                mark = len(board.lines)
                sent = time.monotonic()
                assert store.set(name + "\\setPoint", str(value)).applied
                index, how = board.expect(rf"^set point {value} from (notify|get)$", after=mark, timeout=10)
                # "get": written while the thermostat restarted into the new version, read at its boot.
                (latencies if how.group(1) == "notify" else across_restart).append(board.times[index] - sent)
            for msg in peer.read_all():  # the telemetry that came meanwhile
                data = json.loads(msg.payload)
                if (data.get("update") or {}).get("state") == "downloading":
                    heap.append((data["mem_free"], data["mem_largest"]))
                if data["fw"] == "0.2.0" and data["registered"]:
                    pending.discard(data["device"])
    took = time.monotonic() - started
    for board in fleet.values():
        assert "MemoryError" not in board.output() and "fault" not in board.output()
    latencies.sort()
    return {"took_s": took, "p50_ms": 1000 * statistics.median(latencies), "max_ms": 1000 * latencies[-1],
            "samples": len(latencies), "across_restart_max_ms": 1000 * max(across_restart, default=0),
            "across_restart": len(across_restart),
            "heap_min": (min((h[0] for h in heap), default=None), min((h[1] for h in heap), default=None))}


def test_a_fleet_of_5_updates_while_set_points_keep_being_applied(gateway, boards, bundles, paho_peer):
    figures = fleet_update(gateway, boards, bundles, paho_peer, 5)
    print("fleet of 5:", figures)
    assert figures["max_ms"] < 1000, figures


@pytest.mark.slow
def test_a_fleet_of_20_updates_while_set_points_keep_being_applied(gateway, boards, bundles, paho_peer):
    figures = fleet_update(gateway, boards, bundles, paho_peer, 20)
    print("fleet of 20:", figures)
    assert figures["max_ms"] < 1000, figures


def test_a_version_the_gateway_does_not_have_is_reported_and_the_thermostat_keeps_working(gateway, boards, paho_peer):
    name = longest_name("t-unknown")  # the name is in strings kept for the run: the heap bound holds with the longest
    board = boards(name)
    peer = paho_peer(gateway.host, gateway.port)
    peer.subscribe(f"devices/{name}/messages/events/+", 0)
    with StateStoreClient(gateway.host, gateway.port, client_id="op-unknown", timeout=10) as store:
        assert store.set(name + "\\desiredFirmware", b"9.9.9").applied
        board.expect(r"^update: waiting 9\.9\.9: gateway: .*unknown version 9\.9\.9$", timeout=30)
        data = telemetry_while(peer, name, lambda d: d["registered"] and (d.get("update") or {}).get("state") == "waiting")[-1]
        assert (data["fw"], data["faults"], data["update"]["version"]) == (OLD, 0, "9.9.9"), data
        mark = len(board.lines)
        assert store.set(name + "\\setPoint", b"23").applied
        board.expect(r"^set point 23.0 from notify$", after=mark)
        assert store.set(name + "\\desiredFirmware", OLD).applied  # nothing wanted any more: ota.py unloads
        board.expect(r"^update: none wanted now$", after=mark)
    data = telemetry_while(peer, name, lambda d: d["update"] is None)[-1]
    # What ota.py interned stays, within the qstr pools the thermostat already has; nothing else does.
    # One name too many allocates a fifth pool (3.5 KB) in the middle of the heap.
    print("heap after ota.py was called (a version waited for, then none wanted):", data["mem_free"], data["mem_largest"])
    assert data["mem_free"] >= 16 * 1024 and data["mem_largest"] >= 4 * 1024, data
    assert board.boots == 3 and "Traceback" not in board.output(), board.output()


def test_an_update_within_the_64k_heap(gateway, boards, bundles):
    """The check the issue names (a strict xfail until the updater ran at boot on its own)."""
    board = boards("t-64k", heap="64K")
    publish(gateway, str(bundles["0.2.0"]), "--target", "t-64k")
    board.expect(r"^firmware 0\.2\.0 accepted$", timeout=60)
    assert "MemoryError" not in board.output() and "Traceback" not in board.output(), board.output()
