"""RigClient against a pty whose other end the test plays, byte for byte."""

from __future__ import annotations

import os
import select
import tty
from collections.abc import Iterator

import pytest

from hil_tests.rig.client import RigClient, RigError


@pytest.fixture
def line() -> Iterator[tuple[int, str]]:
    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        yield master, os.ttyname(slave)
    finally:
        os.close(master)
        os.close(slave)


def _sent(master: int) -> bytes:
    assert select.select([master], [], [], 5)[0]
    return os.read(master, 1024)


def test_commands_go_out_as_lines_and_ok_replies_come_back_without_ok(line):
    master, device = line
    log: list[tuple[str, str]] = []
    with RigClient(device, on_command=lambda command, reply: log.append((command, reply))) as rig:
        os.write(master, b"OK RATE 9600 3000\n")
        assert rig.rate(9600, 3000) == "RATE 9600 3000"
        assert _sent(master) == b"RATE 9600 3000\n"
        os.write(master, b"OK LOSS 2.5\n")
        assert rig.loss(2.5) == "LOSS 2.5"
        assert _sent(master) == b"LOSS 2.5\n"
    assert log == [("RATE 9600 3000", "OK RATE 9600 3000"), ("LOSS 2.5", "OK LOSS 2.5")]


def test_status_becomes_a_dict_and_features_a_set(line):
    master, device = line
    with RigClient(device) as rig:
        os.write(master, b"OK backend=netns up=1 features=rate,down gateway_ns=hilrig-1-gw\n")
        assert rig.status() == {"backend": "netns", "up": "1", "features": "rate,down", "gateway_ns": "hilrig-1-gw"}
        os.write(master, b"OK backend=netns features=rate,down\n")
        assert rig.features() == {"rate", "down"}


def test_err_raises_with_the_reason(line):
    master, device = line
    with RigClient(device) as rig:
        os.write(master, b"ERR DELAY not supported by backend netns\n")
        with pytest.raises(RigError) as error:
            rig.delay(10)
        assert (error.value.command, error.value.reason) == ("DELAY 10", "DELAY not supported by backend netns")


def test_silence_and_garbage_raise_instead_of_hanging(line):
    master, device = line
    with RigClient(device, timeout=0.2) as rig:
        with pytest.raises(RigError, match="no reply within the timeout"):
            rig.up()
        os.write(master, b"HELLO\n")
        with pytest.raises(RigError, match="unexpected reply 'HELLO'"):
            rig.down()
