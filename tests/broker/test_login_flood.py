"""Password hashing is no denial of service: a real ``appliance run`` with a password file written by
``appliance passwd`` (the default 210,000 PBKDF2 rounds), floods of wrong-password CONNECTs from other
loopback addresses (127.0.0.x are all loopback on Linux), and a legitimate login timed on the side.

Before the fix, 200 wrong-password CONNECTs sent and dropped in 0.12 s queued 200 PBKDF2 checks, and a
legitimate login waited for all of them (45 s on the build machine).
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.writer import encode
from appliance.broker.security.login_gate import FAILURE_BURST
from testing.processes import GatewayProcess, password_file
from tests.broker.clients import RawClient, unique

#: The bound the issue sets for a legitimate login during a flood, on a quiet machine.
LOGIN_BOUND = 2.0
#: On a busy one the bound is this many logins as this machine does them now, outside any flood, when that
#: is longer: a flood that were hashed ahead of the login would cost FLOOD of them.
QUIET_LOGINS = 10
FLOOD = 200
#: "alice" is the flood's target; each legitimate login uses a user never seen before, so its password
#: needs a real PBKDF2 check (a proven password would be answered from memory).
USERS = {"alice": "wonderland", "bob": "builder", "carol": "c-pass", "dave": "d-pass", "erin": "e-pass"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("flood")
    passwords = password_file(work / "passwd", USERS)
    config = work / "gateway.toml"
    config.write_text(f'[broker.auth]\nallow_anonymous = false\npassword_file = "{passwords}"\n')
    with GatewayProcess(work / "data", config=config) as process:
        yield process


@pytest.fixture(scope="module")
def login_bound(gateway: GatewayProcess) -> float:
    """`LOGIN_BOUND`, or `QUIET_LOGINS` logins as long as one takes here now without a flood."""
    reason, quiet = timed_login(gateway.port, "127.0.0.9", "erin")
    assert reason == rc.SUCCESS
    return max(LOGIN_BOUND, QUIET_LOGINS * quiet)


def flood(port: int, source: str, count: int = FLOOD, level: int = 5) -> None:
    """Wrong-password CONNECTs, each sent and its socket closed at once (what the issue measured)."""
    connect = encode(pk.Connect(level, "", True, 60, username="alice", password=b"wrong"), level)
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), source_address=(source, 0)) as sock:
            sock.sendall(connect)


def timed_login(port: int, source: str, username: str) -> tuple[int, float]:
    started = time.monotonic()
    client = RawClient(port, source=source)
    try:
        connack = client.connect(unique("legit"), username=username, password=USERS[username].encode())
    finally:
        client.sock.close()
    return connack.reason_code, time.monotonic() - started


def test_a_login_from_another_address_completes_during_a_flood(gateway: GatewayProcess, login_bound: float) -> None:
    flood(gateway.port, "127.0.0.2")
    reason, elapsed = timed_login(gateway.port, "127.0.0.1", "bob")
    print(f"legitimate login from another address after {FLOOD} wrong-password CONNECTs: {elapsed:.2f} s")
    assert reason == rc.SUCCESS and elapsed < login_bound


def test_a_login_from_the_flooding_address_completes_while_it_is_under_the_limit(gateway: GatewayProcess,
                                                                                 login_bound: float) -> None:
    flood(gateway.port, "127.0.0.3", count=3)
    reason, elapsed = timed_login(gateway.port, "127.0.0.3", "carol")
    assert reason == rc.SUCCESS and elapsed < login_bound


def test_an_address_over_the_limit_is_refused_without_hashing(gateway: GatewayProcess, login_bound: float) -> None:
    """MQTT 5 gets 0x9F; the 3.1.1 return code (3) is in test_login_gate.py."""
    level, expected = 5, rc.CONNECTION_RATE_EXCEEDED
    clients = [RawClient(gateway.port, level, source="127.0.0.5") for _ in range(FAILURE_BURST + 3)]
    try:
        for client in clients:  # all of them stay open: their checks cannot be skipped
            client.send(pk.Connect(level, unique("guess"), True, 60, username="alice", password=b"guess"))
        answers = Counter(client.expect(pk.Connack).reason_code for client in clients)
        assert answers == {rc.BAD_USERNAME_OR_PASSWORD: FAILURE_BURST, expected: 3}
    finally:
        for client in clients:
            client.sock.close()
    reason, elapsed = timed_login(gateway.port, "127.0.0.1", "dave")
    assert reason == rc.SUCCESS and elapsed < login_bound
