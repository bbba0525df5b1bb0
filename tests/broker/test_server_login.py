"""The login gate behind real sockets, in-process (so the test can read the gate's counters): a check
whose client closed its socket while waiting is skipped, on asyncio's own loop and on uvloop, and
refusing a client that already left is no internal error."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable

import pytest
import uvloop

from appliance.broker.broker import Broker
from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.writer import encode
from appliance.broker.security.auth import Authenticator, hash_password
from testing.inprocess import InProcessBroker
from testing.waiting import wait_until
from tests.broker.clients import RawClient, unique


def with_users(broker: Broker) -> None:
    broker.authenticator = Authenticator(
        {"alice": hash_password("alice"), "bob": hash_password("bob")}, allow_anonymous=False
    )


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_checks_of_clients_that_left_are_skipped_and_a_login_stays_fast(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    thread_cpu = time.thread_time()
    hash_password("probe")  # what one check costs in CPU (the same PBKDF2 iterations as bob's)
    hash_cpu_s = time.thread_time() - thread_cpu
    with InProcessBroker(None, loop=loop_factory(), before_listen=with_users) as hosted:
        gate = hosted.broker.login_gate
        wrong = encode(pk.Connect(5, "", username="alice", password=b"wrong"), 5)
        for _ in range(50):
            with socket.create_connection((hosted.host, hosted.port), source_address=("127.0.0.2", 0)) as sock:
                sock.sendall(wrong)
        cpu_before = time.process_time()
        client = RawClient(hosted.port, source="127.0.0.1")
        connack = client.connect(unique("bob"), username="bob", password=b"bob")
        cpu_spent = time.process_time() - cpu_before
        client.sock.close()
        assert connack.reason_code == rc.SUCCESS
        # Fast in work, not in wall time (which a busy machine stretches: 2.7 s under make test-busy): the
        # process hashed at most the checks already running and bob's. A gate that hashed the abandoned
        # checks too would spend about `burst` hashes here; the bound is halfway between.
        hashes = gate.slots + 1 + (gate.burst - gate.slots - 1) / 2
        assert cpu_spent < hashes * hash_cpu_s, (cpu_spent, hash_cpu_s)
        wait_until(lambda: gate.running == 0 and gate.waiting == 0)
        assert gate.skipped >= gate.burst - gate.slots - 1  # those that waited were skipped, not hashed
    assert "internal error" not in caplog.text
