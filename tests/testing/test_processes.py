"""The process helpers must never report a port that some other program holds as our broker."""

import socket

import psutil
import pytest

from testing.processes import MosquittoProcess


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
