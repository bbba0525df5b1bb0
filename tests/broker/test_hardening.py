"""Broker defects found by a hostile-client campaign (issue 12), each pinned by a test on the fake clock
(``tests/broker/pair.py``) under MQTT 3.1.1 and 5 where the behaviour exists in both."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.security.acl import Acl
from appliance.broker.security.auth import Authenticator, hash_password
from tests.broker.pair import BrokerPair
from tests.broker.test_timing import publishes
from tests.broker.versions import LEVELS, durable


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[BrokerPair]:
    pair = BrokerPair(tmp_path)
    yield pair
    pair.stop()


class LockedStore:
    """Another writer holds ``broker.db``'s write lock, so every commit fails at once (as on a full disk)
    until ``release``. Keep a reference until then: the blocking connection is in a reference cycle (its
    statement cache), so an object left unreferenced is freed by whichever garbage collection comes next,
    and the lock with it - at a moment of the collector's choosing (a test that dropped it at once failed
    only when a collection ran before its publishes)."""

    def __init__(self, pair: BrokerPair, path: Path) -> None:
        assert pair.store is not None
        pair.store._db.execute("PRAGMA busy_timeout = 0")
        self._blocker = sqlite3.connect(path, isolation_level=None)
        self._blocker.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self._blocker.execute("ROLLBACK")
        self._blocker.close()


# -- 9: commit before ack on the close path ------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_publish_and_disconnect_in_one_read_get_no_puback_before_the_commit(
    pair: BrokerPair, tmp_path: Path, level: int
) -> None:
    subscriber = pair.client(level)
    subscriber.connect("sub", **durable(level))  # type: ignore[arg-type]
    subscriber.subscribe("t", 1)
    subscriber.drop()  # away: the message must be stored for it before anyone may acknowledge it
    publisher = pair.client(level)
    publisher.connect("pub")
    locked = LockedStore(pair, tmp_path / "broker.db")
    publisher.send(pk.Publish("t", b"kept", qos=1, packet_id=7), pk.Disconnect())
    assert publisher.closed
    # MQTT 5 learns why (0x80: a lock is not a full disk); 3.1.1 has no way to say no: no PUBACK at all.
    acks = [p for p in publisher.received() if isinstance(p, pk.PubAck)]
    assert [a.reason_code for a in acks] == ([rc.UNSPECIFIED_ERROR] if level == pk.MQTT_5 else [])
    locked.release()
    pair.advance(1.0)  # the next flush commits what was kept
    back = pair.client(level)
    back.send(pk.Connect(level, "sub", **durable(level)))  # type: ignore[arg-type]
    assert [m.payload for m in publishes(back.received())] == [b"kept"]


@pytest.mark.parametrize("level", LEVELS)
def test_publish_and_disconnect_in_one_read_get_the_puback_once_committed(pair: BrokerPair, level: int) -> None:
    publisher = pair.client(level)
    publisher.connect("pub")
    publisher.send(pk.Publish("t", b"x", qos=1, packet_id=7), pk.Disconnect())
    assert publisher.closed
    [ack] = publisher.received()
    assert isinstance(ack, pk.PubAck) and ack.packet_id == 7


# -- 12: CONNECT and a bad packet in one read ----------------------------------------------------------

RESERVED_PACKET = b"\x00\x00"  # packet type 0 is reserved: 0x81 malformed packet


def users(*names: str) -> Authenticator:
    """A password file with ``names`` (password = name), hashed cheaply: checks still take the worker
    path (``run_blocking``) the first time."""
    return Authenticator({name: hash_password(name, iterations=1000) for name in names}, allow_anonymous=False)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("hashed", [False, True], ids=["anonymous", "password-check"])
def test_connect_then_a_bad_packet_in_one_read_gets_connack_success_then_the_reason(
    tmp_path: Path, level: int, hashed: bool
) -> None:
    pair = BrokerPair(tmp_path, authenticator=users("alice") if hashed else None)
    client = pair.client(level)
    credentials = {"username": "alice", "password": b"alice"} if hashed else {}
    client.send(pk.Connect(level, "c", **credentials), RESERVED_PACKET)  # type: ignore[arg-type]
    packets = client.received()
    assert isinstance(packets[0], pk.Connack) and packets[0].reason_code == rc.SUCCESS
    if level == pk.MQTT_5:
        assert [type(p) for p in packets[1:]] == [pk.Disconnect]
        assert packets[1].reason_code == rc.MALFORMED_PACKET  # type: ignore[union-attr]
    else:
        assert packets[1:] == []  # 3.1.1 has no server DISCONNECT
    assert client.closed
    pair.stop()


@pytest.mark.parametrize("level", LEVELS)
def test_packets_before_the_bad_one_in_a_read_are_handled_in_order(pair: BrokerPair, level: int) -> None:
    watcher = pair.client(level)
    watcher.connect("watcher")
    watcher.subscribe("t", 1)
    client = pair.client(level)
    client.send(pk.Connect(level, "c"), pk.Publish("t", b"before", qos=1, packet_id=1), RESERVED_PACKET)
    assert [type(p) for p in client.received()][:2] == [pk.Connack, pk.PubAck]
    assert [m.payload for m in publishes(watcher.received())] == [b"before"]
    assert client.closed


# -- 1: a session belongs to the user that created it; deliveries are checked when sent -----------------

ACL_BEFORE = "user alice\ntopic readwrite t/#\nuser bob\ntopic write t/#\n"
ACL_AFTER = "user alice\ntopic readwrite t/open\nuser bob\ntopic write t/#\n"


def login(name: str) -> dict[str, object]:
    return {"username": name, "password": name.encode()}


def park_alice(pair: BrokerPair, level: int) -> None:
    """alice's durable session (client id ``dev``) subscribed to ``t/#`` and disconnected: what is published
    to it now waits in the store for her return."""
    alice = pair.client(level)
    alice.connect("dev", **durable(level), **login("alice"))  # type: ignore[arg-type]
    alice.subscribe("t/#", 1)
    alice.drop()


def alice_returns(pair: BrokerPair, level: int) -> list[pk.Publish]:
    """alice back on her durable session: the messages it delivers at once."""
    back = pair.client(level)
    back.send(pk.Connect(level, "dev", **durable(level), **login("alice")))  # type: ignore[arg-type]
    return publishes(back.received())


@pytest.fixture
def users_pair(tmp_path: Path) -> Iterator[BrokerPair]:
    pair = BrokerPair(tmp_path, authenticator=users("alice", "bob", "mallory"), acl=Acl.parse(ACL_BEFORE))
    yield pair
    pair.stop()


@pytest.mark.parametrize("level", LEVELS)
def test_another_user_cannot_resume_a_durable_session(users_pair: BrokerPair, level: int) -> None:
    pair = users_pair
    park_alice(pair, level)
    bob = pair.connected("bob", level, **login("bob"))
    bob.send(pk.Publish("t/a", b"for alice", qos=1, packet_id=1))
    mallory = pair.client(level)
    mallory.send(pk.Connect(level, "dev", **durable(level), **login("mallory")))  # type: ignore[arg-type]
    [connack] = mallory.received()  # nothing queued for alice reaches mallory
    assert isinstance(connack, pk.Connack) and connack.reason_code == rc.NOT_AUTHORIZED
    assert not connack.session_present and mallory.closed
    assert [m.payload for m in alice_returns(pair, level)] == [b"for alice"]


@pytest.mark.parametrize("level", LEVELS)
def test_another_user_cannot_take_over_a_connected_client_id(users_pair: BrokerPair, level: int) -> None:
    pair = users_pair
    alice = pair.client(level)
    alice.connect("dev", **login("alice"))  # type: ignore[arg-type]
    mallory = pair.client(level)
    assert mallory.connect("dev", **login("mallory")).reason_code == rc.NOT_AUTHORIZED  # type: ignore[arg-type]
    assert not alice.closed and alice.received() == []
    again = pair.client(level)
    assert again.connect("dev", **login("alice")).reason_code == rc.SUCCESS  # type: ignore[arg-type]
    assert alice.closed  # the same user may take its own session over


@pytest.mark.parametrize("level", LEVELS)
def test_queued_messages_are_checked_against_the_acl_when_sent(users_pair: BrokerPair, level: int) -> None:
    pair = users_pair
    park_alice(pair, level)
    bob = pair.connected("bob", level, **login("bob"))
    bob.send(pk.Publish("t/secret", b"no longer yours", qos=1, packet_id=1),
             pk.Publish("t/open", b"still yours", qos=1, packet_id=2))
    pair.broker.reload_security(pair.broker.authenticator, Acl.parse(ACL_AFTER))  # SIGHUP with a new ACL
    assert [m.topic for m in alice_returns(pair, level)] == ["t/open"]


@pytest.mark.parametrize("level", LEVELS)
def test_the_first_acl_a_reload_brings_checks_what_was_queued_before_it(tmp_path: Path, level: int) -> None:
    """Without an ACL the sessions skip the read check per delivery (a call per message saved); an ACL
    that a SIGHUP brings in later must reach the sessions that exist already: a durable one whose
    messages wait in the store, and a connected one whose messages wait behind its window."""
    pair = BrokerPair(tmp_path, authenticator=users("alice", "bob", "carol"), max_inflight_messages=1)
    try:
        park_alice(pair, level)
        carol = pair.client(level)
        carol.connect("carol", **login("carol"))  # type: ignore[arg-type]
        carol.subscribe("t/#", 1)
        bob = pair.client(level)
        bob.connect("bob", **login("bob"))  # type: ignore[arg-type]
        bob.send(pk.Publish("t/first", b"before", qos=1, packet_id=1),
                 pk.Publish("t/secret", b"no longer yours", qos=1, packet_id=2),
                 pk.Publish("t/open", b"still yours", qos=1, packet_id=3))
        [first] = publishes(carol.received())  # the rest waits behind carol's window of one
        acl = "user alice\ntopic readwrite t/open\nuser bob\ntopic write t/#\nuser carol\ntopic read t/open\n"
        pair.broker.reload_security(pair.broker.authenticator, Acl.parse(acl))
        carol.send(pk.PubAck(first.packet_id or 0))
        assert [m.topic for m in publishes(carol.received())] == ["t/open"]
        back = pair.client(level)
        back.send(pk.Connect(level, "dev", **durable(level), **login("alice")))  # type: ignore[arg-type]
        assert [m.topic for m in publishes(back.received())] == ["t/open"]
    finally:
        pair.stop()
