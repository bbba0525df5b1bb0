"""The rig program end to end with the userspace backend: serial commands over a pty change the link."""

from __future__ import annotations

import os
import select
import signal
import socket
import time
import tty

import pytest
import serial

from hil_tests.rig.client import RigClient, RigError
from hil_tests.rig.launcher import RigStartError, local_rig
from hil_tests.rig.program import build_parser
from hil_tests.rig.shaping import MIN_BURST_BYTES
from hil_tests.rig.tests.flow import WINDOW_S, drain, flooding, measure_connection, quiet_for
from testing import run_queue
from testing.waiting import wait_until


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
                # The relay credits a wake-up it finds late; a wait for a CPU longer than a burst's time
                # while it could not even read its socket can still shift its excess out of the window.
                # The kernel counts the rig's waits (as in test_relay's rate test); on a quiet machine 0.
                with run_queue.sampling(int(ready["pid"])) as cpu_wait, flooding(socket.create_connection(relay)):
                    started = time.time()
                    measured = measure_connection(sink)
                    waited = cpu_wait.since(started)
                shifted = max(0.0, waited - MIN_BURST_BYTES * 8 / rate) / WINDOW_S
                assert rate * (0.85 - shifted) <= measured <= rate * (1.15 + shifted), (rate, measured, waited)
                # Both ends of this round's flow are closed; each round measures one flow on its own.
                _until_no_connection(rig)
            status = rig.status()
            assert status["rate"] == "9600"
            assert int(status["bytes_up"]) > 0


def _until_no_connection(rig: RigClient, timeout: float = 10.0) -> None:
    """Poll STATUS until the relay holds no connection (it ends one when an end closes or resets)."""
    wait_until(lambda: rig.status()["connections"] == "0", timeout,
               what=lambda: f"the relay still holds a closed flow: {rig.status()}")


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
    with pytest.raises(RigStartError, match="needs --target"), local_rig(["--backend", "userspace"], tmp_path / "rig.log"):
        pass


def test_a_host_that_never_reads_replies_cannot_freeze_the_rig(tmp_path):
    """Commands written, replies never read: the rig keeps relaying both ways, drops what it cannot hand
    over (counted in STATUS) and still ends within a second of SIGTERM."""
    with socket.create_server(("127.0.0.1", 0)) as sink:
        backend = ["--backend", "userspace", "--target", f"127.0.0.1:{sink.getsockname()[1]}"]
        with local_rig(backend, tmp_path / "rig.log") as ready:
            host = os.open(ready["serial"], os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
            tty.setraw(host)
            try:
                commands = b"STATUS\n" * 3000  # ~21 KB of commands, ~700 KB of replies nobody reads
                deadline = time.monotonic() + 10
                while commands:
                    assert time.monotonic() < deadline, "the rig stopped reading its serial line"
                    try:
                        commands = commands[os.write(host, commands):]
                    except BlockingIOError:
                        select.select([], [host], [], 0.1)
                # While ~3000 replies pile up unread, the relay keeps carrying bytes both ways, round trip
                # after round trip, for as long as the rig takes to answer every command (about a second).
                with socket.create_connection(_relay_address(ready), timeout=10) as gateway_side:
                    sink.settimeout(10)
                    cloud_side, _ = sink.accept()
                    with cloud_side:
                        cloud_side.settimeout(2)
                        gateway_side.settimeout(2)
                        until = time.monotonic() + 1.5
                        while time.monotonic() < until:
                            gateway_side.sendall(b"up")
                            assert cloud_side.recv(2) == b"up"
                            cloud_side.sendall(b"down")
                            assert gateway_side.recv(4) == b"down"
                # Read again: whole lines, and STATUS says how many replies were dropped.
                backlog = _read_until_quiet(host)
                assert all(line.startswith(b"OK backend=") for line in backlog.splitlines())
                os.write(host, b"STATUS\n")
                seen = _read_until_quiet(host)
                last = seen.splitlines()[-1].decode()
                fields = dict(part.split("=", 1) for part in last.split()[1:])
                assert int(fields["replies_dropped"]) > 0
            finally:
                os.close(host)
            # Within a second of SIGTERM, less the time the rig's thread waited for a CPU meanwhile (the
            # kernel's count: the machine's load, not the rig; make test-busy saw a stop take longer).
            with run_queue.sampling(int(ready["pid"])) as cpu_wait:
                started, started_wall = time.monotonic(), time.time()
                os.kill(int(ready["pid"]), signal.SIGTERM)
                while _alive(int(ready["pid"])):
                    waited = cpu_wait.since(started_wall)
                    assert time.monotonic() - started - waited < 1.0, (
                        f"the rig did not end within 1 s of SIGTERM ({waited:.3f} s waiting for a CPU)")
                    time.sleep(0.01)  # polling for the exit; the bound is the assertion above


def _read_until_quiet(fd: int, timeout: float = 10.0) -> bytes:
    """Everything the rig sends until the line goes quiet after a whole line."""
    seen = b""
    deadline = time.monotonic() + timeout
    while not (seen.endswith(b"\n") and not select.select([fd], [], [], 0.3)[0]):
        assert time.monotonic() < deadline, "the rig sent no whole line"
        if select.select([fd], [], [], 0.5)[0]:
            seen += os.read(fd, 65536)
    return seen


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped by its parent, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "1e400", "soon"])
def test_a_queue_length_that_is_not_a_positive_finite_time_is_refused_by_the_command_line(value, capsys):
    """``--queue-s inf`` ended the rig in a traceback; 0 and negative values started a rig whose every RATE
    failed. Now the command line refuses them in one line (argparse's usage error, exit status 2)."""
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["--serial", "pty", "--backend", "bridge", "--ports", "a,b", "--queue-s", value])
    assert stopped.value.code == 2
    assert "--queue-s" in capsys.readouterr().err
