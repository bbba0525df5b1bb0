"""The client library: async API and notification iterator, leases with fencing, errors, timeouts."""

from __future__ import annotations

import asyncio
import queue
import socket
from collections.abc import Callable

import pytest

from appliance.statestore import errors
from appliance.statestore.client import (
    ERROR_CLASSES,
    AsyncStateStoreClient,
    FencingTokenLower,
    NotConnected,
    RawResponse,
    RequestTimeout,
    ServiceError,
    StateStoreClient,
    UnknownCommand,
)
from appliance.statestore.client.results import raise_for_error
from appliance.statestore.resp3 import ErrorReply, encode_array
from testing.processes import GatewayProcess

Key = Callable[[str], bytes]


def test_async_api_and_notification_iterator(gateway: GatewayProcess, client: StateStoreClient, key: Key) -> None:
    k = key("k")

    async def scenario() -> list[tuple[bytes | None, object]]:
        async with AsyncStateStoreClient(StateStoreClient(gateway.host, gateway.port, timeout=5)) as aclient:
            seen = []
            async with await aclient.watch(k) as notes:
                first = await aclient.set(k, b"1")
                await asyncio.to_thread(client.set, k, b"2")
                await aclient.delete(k)
                async for note in notes:
                    seen.append((note.value, note.version))
                    if len(seen) == 3:
                        break
            assert (await aclient.get(k)).value is None
            assert seen[0] == (b"1", first.version)
            return seen

    seen = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert [value for value, _ in seen] == [b"1", b"2", None]


def test_active_standby_with_fencing(connect: Callable[..., StateStoreClient], key: Key) -> None:
    """The protocol's example: Client1 holds the lock, writes ProtectedKey with its token; Client2 cannot."""
    active, standby = connect(), connect()
    lock_name, protected = key("LockName"), key("ProtectedKey")
    lock1 = active.lease(lock_name, "Client1", ttl_ms=10_000)
    lock2 = standby.lease(lock_name, "Client2", ttl_ms=10_000)
    assert lock1.acquire() and not lock2.acquire()
    first_token = lock1.fencing_token
    assert active.set(protected, b"from-1", fencing_token=first_token).applied
    assert lock1.release()
    assert lock2.acquire()
    assert lock1.fencing_token is None and lock2.fencing_token is not None  # released: no token any more
    assert standby.set(protected, b"from-2", fencing_token=lock2.fencing_token).applied
    # Client1 wakes up and writes with the token it held before: refused.
    with pytest.raises(FencingTokenLower):
        active.set(protected, b"stale", fencing_token=first_token)
    assert active.get(protected).value == b"from-2"


def test_errors_are_typed_and_unknown_ones_keep_their_text(client: StateStoreClient) -> None:
    with pytest.raises(UnknownCommand):
        raise_for_error(client.request(encode_array([b"PING", b"x"])))
    with pytest.raises(ServiceError) as caught:
        raise_for_error(RawResponse(b"-ERR something new\r\n", ErrorReply(b"ERR something new"), ()))
    assert type(caught.value) is ServiceError and caught.value.message == "something new"


def test_timeout_and_not_connected(gateway: GatewayProcess) -> None:
    client = StateStoreClient(gateway.host, gateway.port, timeout=5).connect()
    # Unsubscribe from our response topic: the request is served, but the answer never reaches us.
    client._mqtt.unsubscribe(client.response_topic)
    with pytest.raises(RequestTimeout):
        client.get(b"anything", timeout=0.3)
    client.close()
    with pytest.raises(NotConnected):
        client.get(b"anything")


def test_connect_to_nothing_fails_cleanly() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(NotConnected):
            StateStoreClient("127.0.0.1", port, timeout=1).connect()


def test_empty_value_is_a_value(client: StateStoreClient, key: Key) -> None:  # Go TestStateStoreEmptyValue
    k = key("k")
    assert client.set(k, b"").applied
    got = client.get(k)
    assert got.value == b"" and got.version is not None
    assert client.delete(k).count == 1


def test_token_from_before_the_lock_is_lower(client: StateStoreClient, key: Key) -> None:  # Go TestFencing
    protected = key("protected")
    lease = client.lease(key("lock"), client.client_id, ttl_ms=10_000)
    assert lease.current_holder() is None
    bad_token = client.clock.tick(0)  # the client's own clock, read before the lock was taken
    assert lease.acquire()
    assert lease.current_holder() == client.client_id.encode()
    assert client.set(protected, b"v", fencing_token=lease.fencing_token).applied
    with pytest.raises(FencingTokenLower):
        client.set(protected, b"w", fencing_token=bad_token)
    with pytest.raises(FencingTokenLower):
        client.delete(protected, fencing_token=bad_token)
    assert client.delete(protected, fencing_token=lease.fencing_token).count == 1
    assert lease.release() and lease.current_holder() is None


def test_waiting_acquire_takes_the_lock_when_it_expires(connect: Callable[..., StateStoreClient], key: Key) -> None:
    """Go TestAcquireLockWhenLockIsUnavailable: the waiter gets the lock, with a newer token, at expiry."""
    first, second = connect(), connect()
    lock1 = first.lease(key("lock"), "one", ttl_ms=300)
    lock2 = second.lease(key("lock"), "two", ttl_ms=5_000)
    assert lock1.acquire()
    assert not lock2.acquire()  # no wait: refused at once
    assert lock2.acquire(wait=5.0)
    assert lock2.fencing_token > lock1.fencing_token  # type: ignore[operator]
    assert lock2.current_holder() == b"two"
    assert not lock1.renew() and lock1.fencing_token is None  # the old holder lost it


def test_waiting_acquire_gives_up_at_the_deadline(connect: Callable[..., StateStoreClient], key: Key) -> None:
    first, second = connect(), connect()
    assert first.lease(key("lock"), "one", ttl_ms=60_000).acquire()
    assert not second.lease(key("lock"), "two", ttl_ms=1_000).acquire(wait=0.3)


def test_two_watch_callbacks_on_one_key_are_independent(client: StateStoreClient, key: Key) -> None:
    k = key("k")
    first: queue.Queue[object] = queue.Queue()
    second: queue.Queue[object] = queue.Queue()
    client.keynotify(k, first.put)
    client.keynotify(k, second.put)
    assert client.stop_keynotify(k, first.put) is True  # the other callback keeps the registration
    client.set(k, b"v")
    assert second.get(timeout=5) is not None
    assert first.empty()


def test_every_protocol_error_string_has_its_own_exception_class() -> None:
    assert set(ERROR_CLASSES) == set(errors.ALL)
    assert len(set(ERROR_CLASSES.values())) == len(errors.ALL)
    for message, cls in ERROR_CLASSES.items():
        with pytest.raises(cls) as caught:
            raise_for_error(RawResponse(f"-ERR {message}\r\n".encode(), ErrorReply(f"ERR {message}".encode()), ()))
        assert caught.value.message == message


def test_requests_are_not_held_back_by_nagle(client: StateStoreClient) -> None:
    """One small request at a time is the client's normal traffic: Nagle plus delayed ACK would add ~40 ms."""
    sock = client._mqtt.socket()
    assert isinstance(sock, socket.socket)
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
