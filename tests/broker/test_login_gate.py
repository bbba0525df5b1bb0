"""The password-check gate on its own (pure) and in the broker core on a fake clock: bounded slots,
checks of clients that left are skipped, failures rate limited per address with a bounded table."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.writer import encode
from appliance.broker.security.auth import Authenticator, hash_password
from appliance.broker.security.login_gate import LoginGate, source_key
from testing.campaigns import campaign
from tests.broker.pair import BrokerPair


def test_source_keys_are_the_ipv4_address_or_the_ipv6_slash_64() -> None:
    assert source_key("127.0.0.2:50000") == "127.0.0.2"
    assert source_key("2001:db8:1:2:3:4:5:6:443") == "2001:db8:1:2::/64"
    assert source_key("2001:db8:1:2:ffff::1:443") == source_key("2001:db8:1:2::9:1")
    assert source_key("::ffff:10.0.0.1:1883") == "10.0.0.1"
    assert source_key("fake:1") == "fake"


@given(st.text())
def test_any_peer_text_gets_a_key_and_no_exception(peer: str) -> None:
    assert isinstance(source_key(peer), str)


@given(
    events=st.lists(st.tuples(st.integers(0, 9), st.floats(0, 5), st.booleans()), max_size=300),
    max_addresses=st.integers(1, 8),
)
@campaign(200, deadline=None)
def test_an_address_never_gets_more_failed_checks_than_its_budget_and_the_table_stays_bounded(
    events: list[tuple[int, float, bool]], max_addresses: int
) -> None:
    """Per address, checks admitted and not succeeded never exceed burst + refill x time since the address
    was (re)entered in the table; the table never holds more than its cap, whatever the addresses."""
    gate = LoginGate(burst=3, refill_per_second=0.5, max_addresses=max_addresses)
    now = 0.0
    since: dict[str, tuple[float, int]] = {}  # address -> (entered at, failures since)
    for index, step, success in events:
        now += step
        peer = f"10.0.0.{index}:1"
        if source_key(peer) not in gate._buckets:
            since[peer] = (now, 0)
        if gate.admit(peer, now) is None:
            if success:
                gate.succeeded(peer, now)
            else:
                entered, failures = since[peer]
                since[peer] = (entered, failures + 1)
                assert failures + 1 <= 3 + 0.5 * (now - entered) + 1e-9
        assert gate.addresses <= max_addresses


@given(st.lists(st.sampled_from(["enter", "leave", "abandon"]), max_size=200))
def test_slots_are_never_exceeded_and_never_leak(operations: list[str]) -> None:
    """Whatever the order of arrivals, finished checks and cancelled waiters (``abandon``, either still
    queued or just handed the slot), at most ``slots`` run and a slot is never lost or doubled."""
    gate = LoginGate(slots=2, max_waiting=1000, burst=1000)
    holders: list[Callable[[], None]] = []  # wakes of the callers holding a slot
    queued: list[Callable[[], None]] = []
    woken: list[Callable[[], None]] = []

    def new_wake() -> Callable[[], None]:
        def wake() -> None:
            woken.append(wake)
        return wake

    for operation in operations:
        if operation == "enter":
            assert gate.admit("10.0.0.1:1", 0.0) is None
            wake = new_wake()
            (holders if gate.enter(wake) else queued).append(wake)
        elif operation == "leave" and holders:
            holders.pop(0)
            gate.leave()
        elif operation == "abandon" and (queued or holders):
            # The last queued waiter is cancelled, or (no one queued) a holder is cancelled right after
            # its wake-up, before it ran.
            wake = queued.pop() if queued else holders.pop()
            gate.abandon(wake)
        while woken:
            wake = woken.pop()
            queued.remove(wake)
            holders.append(wake)
        assert len(holders) == gate.running <= 2 and len(queued) == gate.waiting
        assert gate.waiting == 0 or gate.running == 2


def users(*names: str) -> Authenticator:
    return Authenticator({name: hash_password(name, iterations=1000) for name in names}, allow_anonymous=False)


def test_a_check_whose_client_left_while_waiting_is_skipped_and_others_go_on() -> None:
    pair = BrokerPair(authenticator=users("alice"))
    clients = [pair.client() for _ in range(4)]
    for index, client in enumerate(clients):  # four CONNECTs in one loop turn: two slots, two wait
        pair.broker.data_received(client, _connect(f"c{index}", "alice"))
    clients[2].left_unnoticed = True  # closed its socket; the broker is not reading it
    pair.runtime.run()
    assert [c.received() != [] for c in clients] == [True, True, False, True]
    assert pair.broker.login_gate.skipped == 1
    assert pair.broker.login_gate.running == 0 and pair.broker.login_gate.waiting == 0
    pair.stop()


def test_connects_read_in_one_turn_count_against_the_waiting_bound_before_they_enter() -> None:
    gate = LoginGate(max_waiting=3)
    assert [gate.admit(f"10.0.0.{n}:1", 0.0) for n in range(5)] == [None, None, None, rc.SERVER_BUSY, rc.SERVER_BUSY]
    gate.enter(lambda: None)
    gate.enter(lambda: None)  # both run: two places free again
    assert gate.admit("10.0.0.9:1", 0.0) is None


def test_failures_from_one_address_are_refused_without_hashing_and_others_still_log_in() -> None:
    pair = BrokerPair(authenticator=users("alice"))
    gate = pair.broker.login_gate
    answers = []
    for _ in range(gate.burst + 2):
        client = pair.client()  # every fake client comes from the address "fake"
        client.send(pk.Connect(pk.MQTT_5, "", username="alice", password=b"wrong"))
        answers.append(client.expect(pk.Connack).reason_code)
    assert answers == [rc.BAD_USERNAME_OR_PASSWORD] * gate.burst + [rc.CONNECTION_RATE_EXCEEDED] * 2
    old = pair.client(pk.MQTT_311)
    old.send(pk.Connect(pk.MQTT_311, "x", username="alice", password=b"wrong"))
    assert old.expect(pk.Connack).reason_code == rc.SERVER_UNAVAILABLE  # 3.1.1 return code 3
    pair.advance(1 / gate.refill_per_second)  # one token back
    client = pair.client()
    assert client.connect("ok", username="alice", password=b"alice").reason_code == rc.SUCCESS
    pair.stop()


def _connect(client_id: str, username: str) -> bytes:
    return encode(pk.Connect(pk.MQTT_5, client_id, username=username, password=username.encode()), pk.MQTT_5)
