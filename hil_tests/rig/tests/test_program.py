"""The rig program end to end with the userspace backend: serial commands over a pty change the link."""

from __future__ import annotations

import os
import socket

import pytest
import serial

from hil_tests.rig.client import RigClient, RigError
from hil_tests.rig.launcher import RigStartError, local_rig
from hil_tests.rig.tests.flow import drain, flooding, measure_connection, quiet_for


def _relay_address(ready: dict[str, str]) -> tuple[str, int]:
    host, port = ready["listen"].rsplit(":", 1)
    return host, int(port)


def test_rate_commands_over_serial_change_the_measured_throughput(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as sink:
        backend = ["--backend", "userspace", "--target", f"127.0.0.1:{sink.getsockname()[1]}"]
        with local_rig(backend, tmp_path / "rig.log") as ready, RigClient(ready["serial"]) as rig:
            relay = _relay_address(ready)
            for rate in (64_000, 9_600):
                assert rig.rate(rate) == f"RATE {rate}"
                with flooding(socket.create_connection(relay)):
                    assert measure_connection(sink) == pytest.approx(rate, rel=0.15)
            status = rig.status()
            assert status["rate"] == "9600"
            assert int(status["bytes_up"]) > 0


def test_down_over_serial_stops_the_flow_and_up_resumes_it(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as sink:
        backend = ["--backend", "userspace", "--target", f"127.0.0.1:{sink.getsockname()[1]}"]
        with local_rig(backend, tmp_path / "rig.log") as ready, RigClient(ready["serial"]) as rig:
            rig.rate(64_000)
            with flooding(socket.create_connection(_relay_address(ready))):
                sink.settimeout(10)
                connection, _ = sink.accept()
                with connection:
                    connection.settimeout(10)
                    assert connection.recv(65536)
                    assert rig.down() == "DOWN"
                    drain(connection)
                    assert quiet_for(connection, 0.5)
                    assert rig.status()["up"] == "0"
                    rig.up()
                    connection.settimeout(10)
                    assert connection.recv(65536)


def test_bad_lines_get_err_and_the_rig_keeps_serving(tmp_path):
    with local_rig(["--backend", "userspace", "--target", "127.0.0.1:9"], tmp_path / "rig.log") as ready:
        with serial.Serial(ready["serial"], timeout=10) as line:
            for garbage, reason in [
                (b"RATE \xff\xfe\n", b"ERR line is not ASCII\n"),  # what a noisy line delivers
                (b"X" * 300 + b"\n", b"ERR line longer than 128 bytes\n"),
                (b"\n\nfly away\r\n", b"ERR unknown command 'fly'\n"),  # blank lines get no reply
            ]:
                line.write(garbage)
                assert line.readline() == reason
        with RigClient(ready["serial"]) as rig:
            with pytest.raises(RigError, match="below 100"):
                rig.loss(100)
            assert rig.status()["loss"] == "0"


def test_rig_opens_a_serial_device_by_name(tmp_path):
    """The real-bench mode: the rig opens a device with pyserial (here the slave end of our own pty)."""
    master, slave = os.openpty()
    try:
        device = os.ttyname(slave)
        args = ["--backend", "userspace", "--target", "127.0.0.1:9"]
        with local_rig(args, tmp_path / "rig.log", serial_device=device) as ready:
            assert ready["serial"] == device
            with open(master, "r+b", buffering=0, closefd=False) as line:
                rig = RigClient(line)
                assert rig.rate(9600) == "RATE 9600"
                assert rig.status()["rate"] == "9600"
    finally:
        os.close(master)
        os.close(slave)


def test_a_rig_that_cannot_start_is_reported_with_its_stderr(tmp_path):
    with pytest.raises(RigStartError, match="needs --target"):
        with local_rig(["--backend", "userspace"], tmp_path / "rig.log"):
            pass
