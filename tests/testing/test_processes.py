"""The process helpers must never report a port that some other program holds as our broker."""

import socket
import sys

import psutil
import pytest

from testing.processes import GatewayProcess, MosquittoProcess, ephemeral_ports, free_port


@pytest.fixture
def taken_port():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        yield squatter.getsockname()[1]


def test_mosquitto_on_a_taken_port_chosen_by_the_caller_is_an_error(tmp_path, taken_port):
    with pytest.raises(RuntimeError, match="did not start listening"):
        MosquittoProcess(tmp_path, port=taken_port).start()


def test_mosquitto_moves_to_another_free_port_when_its_pick_was_taken(tmp_path, taken_port):
    broker = MosquittoProcess(tmp_path)
    broker.port = taken_port  # as if another process took free_port()'s answer before mosquitto bound it
    with broker:
        assert broker.port != taken_port
        assert f"listen socket on port {broker.port}" in broker.log_text()


def test_a_started_mosquitto_used_as_a_context_is_the_only_one_and_stops_with_it(tmp_path):
    def ours() -> list[psutil.Process]:
        return [child for child in psutil.Process().children() if child.name() == "mosquitto"]

    with MosquittoProcess(tmp_path).start() as mosquitto:
        assert [child.pid for child in ours()] == [mosquitto.process.pid]
    assert ours() == []


def test_a_gateway_that_cannot_bind_its_port_is_an_error_not_a_started_gateway(tmp_path, taken_port):
    with pytest.raises(RuntimeError, match="stopped before it was ready") as failure:
        GatewayProcess(tmp_path / "data", port=taken_port).start()
    assert str(taken_port) in str(failure.value)


class OutputClosedStillRunning(GatewayProcess):
    """A start that fails the way a gateway exiting on a bind error looks for a moment: its output has
    closed, and the process is not reaped yet."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import os, time; print('cannot bind', flush=True); os.close(1); os.close(2); time.sleep(30)"]


def test_output_closing_before_the_ready_line_is_never_taken_for_a_start(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)stopped before it was ready.*cannot bind"):
        OutputClosedStillRunning(tmp_path).start(timeout=20)


def test_free_port_is_bindable_and_never_one_the_kernel_hands_out_by_itself(tmp_path):
    port = free_port()
    assert port not in ephemeral_ports()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_each_xdist_worker_picks_from_its_own_ports(monkeypatch):
    picked: dict[str, set[int]] = {}
    for worker in ("gw0", "gw1", "gw5"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        picked[worker] = {free_port() for _ in range(20)}
    assert not picked["gw0"] & picked["gw1"] and not picked["gw1"] & picked["gw5"] and not picked["gw0"] & picked["gw5"]
