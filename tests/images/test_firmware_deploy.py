"""images/firmware/deploy.py: config validation, the board checks, the order of the steps, the report.

The steps run against the MicroPython unix port as a board (firmware_board.py: a flash directory, real
resets of a real interpreter) and our gateway, so "safe boot before copying", "stale files gone",
"waits for the first telemetry" are observed, not assumed. mpremote itself and a real board's
serial port are not exercised here: MpremoteBoard is covered by the dry run only.
"""

import json
import subprocess
import sys
import zipfile

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from appliance.firmware.protocol import THERMOSTAT_NAME
from images.firmware import deploy
from testing.processes import GatewayProcess, password_file
from tests.device_firmware.micropython import ROOT
from tests.device_firmware.thermostat_rig import thermostat_config
from tests.images.firmware_board import UnixPortBoard

BUILD = ROOT / "images" / "firmware" / "build.py"
DEPLOY = ROOT / "images" / "firmware" / "deploy.py"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, str(BUILD), "--out", str(out)], capture_output=True, text=True, check=True)
    return out / proc.stdout.strip().rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def template(bundle):
    with zipfile.ZipFile(bundle) as archive:
        return json.loads(archive.read("config.template.json"))


def board_config(template, **changes) -> dict:
    config = json.loads(json.dumps(template))
    config.update(thermostat="t-field-1")
    config["broker"]["host"] = "10.0.0.1"
    config["wifi"].update(ssid="plant-net", password="correct horse")
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            config[section][key] = value
        else:
            config[section] = value
    return config


# --- validation ---------------------------------------------------------------------------------------

def test_the_template_itself_is_refused_with_every_placeholder_named(template):
    errors = deploy.config_errors(template)
    assert [e.split(":")[0] for e in errors] == ["thermostat", "broker.host", "wifi.ssid", "wifi.password"]


def test_a_filled_in_board_config_passes(template):
    assert deploy.config_errors(board_config(template)) == []


@pytest.mark.parametrize("changes,field", [
    ({"thermostat": "t/1"}, "thermostat"),
    ({"thermostat": "t#"}, "thermostat"),
    ({"broker__host": ""}, "broker.host"),
    ({"broker__port": 0}, "broker.port"),
    ({"broker__port": "1883"}, "broker.port"),
    ({"wifi__ssid": "x" * 33}, "wifi.ssid"),
    ({"wifi__ssid": None}, "wifi.ssid"),
    ({"wifi__password": "short"}, "wifi.password"),
    ({"hardware__relay_pin": None}, "hardware.relay_pin"),
    ({"hardware__watchdog_ms": 20000}, "hardware.watchdog_ms"),  # not above 4 x 5000 ms
])
def test_each_bad_field_is_named(template, changes, field):
    errors = deploy.config_errors(board_config(template, **changes))
    assert [e.split(":")[0] for e in errors] == [field], errors


def test_an_open_network_and_a_simulated_device_need_no_password_or_wifi(template):
    assert deploy.config_errors(board_config(template, wifi__password=None)) == []
    assert deploy.config_errors({"thermostat": "t-1", "broker": {"host": "gw"}}) == []


def test_stale_files_are_shadowing_sources_and_modules_of_earlier_versions():
    on_board = ["boot.py", "main.py", "config.json", "setpoint.json", "thermostat.py", "thermostat.mpy",
                "old_module.mpy", "notes.txt", "SAFE_BOOT"]
    assert deploy.stale_files(on_board, {"thermostat.mpy", "app.mpy"}) == ["old_module.mpy", "thermostat.py"]


def test_an_mpy_version_the_board_cannot_load_is_refused(bundle, tmp_path):
    manifest = json.loads(zipfile.ZipFile(bundle).read("manifest.json"))
    deploy.check_compatible(manifest, {"name": "micropython", "version": "1.29.0", "mpy": manifest["mpy_version"] | 0x200})
    with pytest.raises(deploy.DeployError, match="loads .mpy version 5, the bundle is version 6"):
        deploy.check_compatible(manifest, {"name": "micropython", "version": "1.19.1", "mpy": 5})
    with pytest.raises(deploy.DeployError, match="no .mpy version"):
        deploy.check_compatible(manifest, {"name": "micropython", "version": "1.12", "mpy": None})


# --- against the unix port as a board ------------------------------------------------------------------

@pytest.fixture
def gateway(tmp_path):
    with GatewayProcess(tmp_path / "gateway") as gw:
        yield gw


def write_config(tmp_path, config) -> object:
    path = tmp_path / "device.json"
    path.write_text(json.dumps(config))
    return path


def test_deploy_over_a_running_thermostat_safe_boots_cleans_copies_and_waits_for_telemetry(
        bundle, tmp_path, gateway, micropython):
    board = UnixPortBoard(tmp_path / "flash", micropython)
    # An earlier install, running: the bundle itself, a source copy that would shadow its .mpy and
    # fail, a module of an older version, and the set point the device saved (data: kept).
    with zipfile.ZipFile(bundle) as archive:
        archive.extractall(board.flash)
    (board.flash / "main.py").write_text(deploy.MAIN_PY)
    (board.flash / "config.json").write_text(json.dumps(thermostat_config("t-dep", gateway.host, gateway.port)))
    (board.flash / "setpoint.json").write_text('{"set_point": 21.5, "version": null}')
    board.reset()
    board.running.expect(r"^registered t-dep\\setPoint$")
    (board.flash / "thermostat.py").write_text("raise SystemExit('stale source copy')\n")
    (board.flash / "old_module.mpy").write_bytes(b"M\x06\x00\x1f")
    # An over-the-air update asked for and not made yet: kept, the deployed version would boot the updater.
    (board.flash / "update.pending").write_text('{"version": "0.0.9", "fw": "0.1.0"}')
    (board.flash / "update.json").write_text('{"state": "refused", "version": "0.0.8"}')
    board.ops.clear()

    config = write_config(tmp_path, thermostat_config("t-dep", gateway.host, gateway.port))
    report = deploy.deploy(bundle, board, config, None, wait_s=30)

    assert report.startswith("t-dep: 0.1.0 running and registered (set point 21.5"), report
    kinds = [op[0] for op in board.ops]
    # Stopped safely first, copied only in safe mode, SAFE_BOOT removed last, then the real boot.
    assert board.ops[:3] == [("implementation",), ("put", "SAFE_BOOT", False), ("reset", True)]
    assert all(op[2] for op in board.ops if op[0] in ("put", "remove") and op[1] != "SAFE_BOOT"), board.ops
    assert board.ops[-2:] == [("remove", "SAFE_BOOT", True), ("reset", False)]
    assert ("clock", True) in board.ops and kinds.count("reset") == 2
    assert board.runs[-2].lines[:1] == ["safe boot: SAFE_BOOT present, thermostat not started"]
    assert {"remove"} == {op[0] for op in board.ops[3:] if op[1] in ("thermostat.py", "old_module.mpy")}
    files = set(board.files())
    assert {"thermostat.py", "old_module.mpy", "SAFE_BOOT", "update.pending", "update.json"}.isdisjoint(files)
    assert "update: fetching" not in "\n".join(run.output() for run in board.runs)
    assert {"setpoint.json", "boot.py", "main.py", "config.json", "thermostat.mpy", "app.mpy"} <= files
    assert "stale source copy" not in board.running.output()


def test_a_device_that_never_reports_is_a_failure_with_the_reason(bundle, tmp_path, gateway, micropython):
    board = UnixPortBoard(tmp_path / "flash", micropython)
    config = write_config(tmp_path, thermostat_config("t-lost", "127.0.0.1", 9))  # a gateway address that is wrong
    with pytest.raises(deploy.DeployError, match=r"no telemetry from t-lost through .* within 3 s"):
        deploy.deploy(bundle, board, config, (gateway.host, gateway.port), wait_s=3)
    board.running.expect(r"^connect failed:")


def test_an_incompatible_board_is_refused_before_anything_is_written(bundle, tmp_path, micropython):
    class OldBoard(UnixPortBoard):
        def implementation(self):
            return {"name": "micropython", "version": "1.19.1", "mpy": 5}

    board = OldBoard(tmp_path / "flash", micropython)
    config = write_config(tmp_path, thermostat_config("t-old", "127.0.0.1", 1883))
    with pytest.raises(deploy.DeployError, match="loads .mpy version 5"):
        deploy.deploy(bundle, board, config, None, wait_s=1)
    assert board.ops == [] and board.files() == []


# --- the command line ----------------------------------------------------------------------------------

def run_deploy(*args):
    return subprocess.run([sys.executable, str(DEPLOY), *map(str, args)], capture_output=True, text=True)


def test_dry_run_prints_the_mpremote_commands_in_order(bundle, tmp_path, template):
    config = write_config(tmp_path, board_config(template))
    proc = run_deploy(bundle, "--port", "/dev/ttyUSB0", "--config", config, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    commands = [line.removeprefix("mpremote connect /dev/ttyUSB0 ") for line in proc.stdout.splitlines()
                if line.startswith("mpremote ")]
    assert commands[0].startswith("exec 'import sys")
    assert commands[1].endswith("SAFE_BOOT :SAFE_BOOT") and commands[2:4] == ["reset", "fs ls :"]
    copied = [c.split()[-1] for c in commands if c.startswith("fs cp ")]
    assert ":thermostat.mpy" in copied and ":main.mpy" not in copied
    assert copied[-3:] == [":config.json", ":boot.py", ":main.py"]
    assert commands[-3].startswith("exec 'import machine; machine.RTC().datetime(")
    assert commands[-2:] == ["fs rm :SAFE_BOOT", "reset"]
    assert "rtc --set" not in proc.stdout  # that would set the host's local time


def test_the_command_refuses_a_tampered_bundle_and_the_unfilled_template(bundle, tmp_path):
    tampered = tmp_path / "tampered.zip"
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(tampered, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, data + b"\0" if name == "mqtt5.mpy" else data)
    good = write_config(tmp_path, {"thermostat": "t-42", "broker": {"host": "gw"}})
    proc = run_deploy(tampered, "--port", "/dev/null", "--config", good, "--dry-run")
    assert proc.returncode == 1 and "mqtt5.mpy: sha256 does not match the manifest" in proc.stderr
    with zipfile.ZipFile(bundle) as archive:
        (tmp_path / "template.json").write_bytes(archive.read("config.template.json"))
    proc = run_deploy(bundle, "--port", "/dev/null", "--config", tmp_path / "template.json", "--dry-run")
    assert proc.returncode == 1
    assert "thermostat: set this device's name" in proc.stderr and "broker.host: set the gateway's address" in proc.stderr


@given(st.text(alphabet=st.characters(codec="ascii"), max_size=70) | st.sampled_from(["t" * 64, "t" * 65, "a.b_c-d"]))
@example("t-01\n")  # deploy.py's `^...$` matched before a final newline
def test_the_gateway_takes_as_a_thermostat_name_exactly_what_deploy_accepts(template, name):
    """`appliance firmware publish --target` and group keys name thermostats that deploy.py set up; a name one
    side accepts and the other refuses is a thermostat that can never be updated."""
    errors = deploy.config_errors(board_config(template, thermostat=name))
    deploy_accepts = not any(error.startswith("thermostat:") for error in errors)
    assert bool(THERMOSTAT_NAME.fullmatch(name)) == deploy_accepts


# --- a gateway that wants a login, as the shipped image does ----------------------------------------------

@pytest.fixture
def gateway_with_logins(tmp_path):
    passwords = password_file(tmp_path / "passwd", {"t-auth": "device-secret", "engineer": "field-secret"})
    config = tmp_path / "gateway.toml"
    config.write_text(f'[broker.auth]\nallow_anonymous = false\npassword_file = "{passwords}"\n')
    with GatewayProcess(tmp_path / "gateway", config=config) as gw:
        yield gw


def test_deploy_watches_the_telemetry_with_the_devices_own_login(bundle, tmp_path, gateway_with_logins, micropython):
    gw = gateway_with_logins
    board = UnixPortBoard(tmp_path / "flash", micropython)
    device = thermostat_config("t-auth", gw.host, gw.port)
    device["broker"].update(user="t-auth", password="device-secret")
    report = deploy.deploy(bundle, board, write_config(tmp_path, device), None, wait_s=30)
    assert report.startswith("t-auth: 0.1.0 running and registered"), report


def test_a_refused_login_is_reported_at_once_with_the_gateways_reason(bundle, tmp_path, gateway_with_logins,
                                                                     micropython):
    gw = gateway_with_logins
    board = UnixPortBoard(tmp_path / "flash", micropython)
    device = thermostat_config("t-auth", gw.host, gw.port)
    device["broker"].update(user="t-auth", password="device-secret")
    wrong = deploy.GatewayLogin("engineer", "not-the-password")
    # A wait far longer than the test's budget: only an answer to the refusal ends it early.
    with pytest.raises(deploy.DeployError, match=r"refused the login as engineer: Bad user name or password"):
        deploy.deploy(bundle, board, write_config(tmp_path, device), None, wait_s=120, login=wrong)


def test_the_command_line_takes_an_operators_login(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("field-secret\n")
    proc = subprocess.run([sys.executable, str(DEPLOY), "b.zip", "--port", "p", "--config", "c.json",
                           "--password-file", str(secret)], capture_output=True, text=True)
    assert proc.returncode == 2 and "--password-file needs --user" in proc.stderr
    missing = subprocess.run([sys.executable, str(DEPLOY), "b.zip", "--port", "p", "--config", "c.json",
                              "--user", "engineer", "--password-file", str(tmp_path / "absent")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "--password-file: cannot read" in missing.stderr
    assert "Traceback" not in missing.stderr
