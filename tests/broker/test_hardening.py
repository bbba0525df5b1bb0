"""Broker defects found by a hostile-client campaign (issue 12), each pinned by a test on the fake clock
(``tests/broker/pair.py``) under MQTT 3.1.1 and 5 where the behaviour exists in both."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.broker.codec import packets as pk
from tests.broker.pair import BrokerPair
from tests.broker.test_timing import LEVELS, durable, publishes


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[BrokerPair]:
    pair = BrokerPair(tmp_path)
    yield pair
    pair.stop()


class LockedStore:
    """Another writer holds ``broker.db``'s write lock, so every commit fails at once (as on a full disk)
    until ``release``."""

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
    assert not [p for p in publisher.received() if isinstance(p, pk.PubAck)]
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
