"""KEYNOTIFY over real MQTT: subscribe first, register, changes in order, STOP, disconnect, expiry."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator

import pytest

from appliance.statestore.client import Notification, StateStoreClient
from appliance.statestore.commands import KeyNotifyCommand
from appliance.statestore.hlc import Hlc
from testing.processes import GatewayProcess
from tests.statestore.raw_mqtt import TIMEOUT, RawClient

Key = Callable[[str], bytes]
SWEEP_INTERVAL_MS = 3_600_000
Connect = Callable[..., StateStoreClient]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The module's gateway sweeps expired keys only when their deadline wakes the sweep: its periodic
    sweep is an hour apart, so an expiry notification that arrives at all came from the deadline."""
    folder = tmp_path_factory.mktemp("gateway")
    config = folder / "gateway.toml"
    config.write_text(f"[statestore]\nsweep_interval_ms = {SWEEP_INTERVAL_MS}\n")
    with GatewayProcess(folder / "data", config=config) as process:
        yield process


def watch(client: StateStoreClient, *keys: bytes) -> queue.Queue[Notification]:
    notes: queue.Queue[Notification] = queue.Queue()
    for k in keys:
        client.keynotify(k, notes.put)
    return notes


def test_changes_arrive_in_order_until_stop(connect: Connect, key: Key) -> None:  # scenarios 33-35
    watcher, writer = connect(), connect()
    k, marker = key("k"), key("marker")
    writer.set(k, b"value1")
    writer.delete(k)
    notes = watch(watcher, k, marker)
    v2 = writer.set(k, b"value2").version
    deleted = writer.delete(k)
    v3 = writer.set(k, b"value3").version
    assert watcher.stop_keynotify(k) is True
    writer.set(k, b"value4")
    writer.delete(k)
    writer.set(marker, b"m")
    received = [notes.get(timeout=TIMEOUT) for _ in range(4)]
    assert [(n.key, n.value, n.version) for n in received] == [
        (k, b"value2", v2),
        (k, None, deleted.version),
        (k, b"value3", v3),
        (marker, b"m", received[3].version),
    ]
    assert watcher.stop_keynotify(k) is False  # ":0": not watched any more


def test_wire_format_topic_and_payload(gateway: GatewayProcess, client: StateStoreClient, key: Key) -> None:
    raw = RawClient(gateway.host, gateway.port, client_id="client-id1")
    try:
        raw.subscribe("clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/+")
        raw.subscribe("clients/client-id1/resp")
        raw.publish(
            "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke",
            KeyNotifyCommand(b"SOMEKEY").encode(),
            response_topic="clients/client-id1/resp",
            correlation_data=b"1",
        )
        assert raw.next_message().payload == b"+OK\r\n"
        version = client.set(b"SOMEKEY", b"abc").version
        note = raw.next_message()
        assert note.topic == (
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/534F4D454B4559"
        )
        assert note.payload == b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n"
        assert note.qos == 1 and ("__ts", str(version)) in note.properties.UserProperty
        client.delete(b"SOMEKEY")
        assert raw.next_message().payload == b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
    finally:
        raw.close()


def test_registrations_vanish_on_disconnect_and_can_be_made_again(connect: Connect, key: Key) -> None:
    writer = connect()
    k, marker = key("k"), key("marker")
    first = connect("watcher-" + key("id").hex()[:20])
    watch(first, k)
    first.close()
    again = connect(first.client_id)  # same client id, new connection: subscribed again, not registered
    notes = watch(again, marker)
    writer.set(k, b"unseen")
    writer.set(marker, b"m1")
    assert notes.get(timeout=TIMEOUT).key == marker  # nothing for k came first
    again.keynotify(k, notes.put)  # re-register
    writer.set(k, b"seen")
    note = notes.get(timeout=TIMEOUT)
    assert (note.key, note.value) == (k, b"seen")


def test_every_watcher_is_notified(connect: Connect, key: Key) -> None:
    k = key("k")
    a, b, writer = connect(), connect(), connect()
    qa, qb = watch(a, k), watch(b, k)
    writer.set(k, b"v")
    assert qa.get(timeout=TIMEOUT).value == b"v" and qb.get(timeout=TIMEOUT).value == b"v"


#: The store's clock is ``time.time()`` in whole milliseconds (``wall_ms`` truncates): a key set at
#: 12.3459 s with PX 300 expires at 12.345 + 0.3, up to a millisecond before 0.3 s has passed by the
#: same clock read as a float. (Exact to the millisecond: tests/statestore/test_store.py, fake clock.)
STORE_CLOCK_STEP_S = 0.001


def test_expiry_notifies_delete_at_the_deadline(connect: Connect, key: Key) -> None:
    watcher, writer = connect(), connect()
    k = key("k")
    notes = watch(watcher, k)
    started = time.time()  # the store's clock: its deadline is this reading or later, plus PX
    set_version = writer.set(k, b"short-lived", expire_ms=300).version
    assert writer.get(k).value == b"short-lived"
    assert notes.get(timeout=TIMEOUT).value == b"short-lived"
    expired = notes.get(timeout=TIMEOUT)  # at all: the periodic sweep is an hour away (the fixture)
    elapsed = time.time() - started
    assert expired.value is None and expired.version == set_version
    assert elapsed >= 0.3 - STORE_CLOCK_STEP_S  # not before the deadline
    assert writer.get(k).value is None


def test_nex_renewal_keeps_a_lease_alive(client: StateStoreClient, key: Key) -> None:
    lease = client.lease(key("lock"), "client1", ttl_ms=400)
    assert lease.acquire() and lease.fencing_token is not None
    rival = client.lease(key("lock"), "client2", ttl_ms=400)
    assert not rival.acquire()
    first_token = lease.fencing_token
    assert lease.renew() and lease.fencing_token > first_token  # type: ignore[operator]
    assert lease.release() is True
    assert rival.acquire()
    assert isinstance(rival.fencing_token, Hlc)
