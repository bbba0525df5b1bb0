"""KEYNOTIFY registrations and the notification topic/payload formats."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from appliance.statestore.hlc import Hlc
from appliance.statestore.notify import (
    MAX_REGISTERED_KEY_BYTES_PER_CLIENT,
    MAX_REGISTRATIONS_PER_CLIENT,
    NotificationRegistry,
    notification_payload,
    notification_topic,
)
from appliance.statestore.store import Change

V = Hlc(1, 1, "S")


def test_topic_is_upper_case_base16_of_client_id_and_key() -> None:
    assert notification_topic("client-id1", b"SOMEKEY") == (
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/534F4D454B4559"
    )
    assert notification_topic("é", b"\x00\xff").endswith("/C3A9/command/notify/00FF")


def test_payloads() -> None:
    assert notification_payload(Change(b"k", b"abc", V)) == b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n"
    assert notification_payload(Change(b"k", None, V)) == b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"


def test_registry_per_client_and_key() -> None:
    registry = NotificationRegistry()
    registry.register("a", b"k")
    registry.register("a", b"k")
    registry.register("b", b"k")
    registry.register("a", b"other")
    assert [n.topic for n in registry.notifications(Change(b"k", b"v", V))] == [
        notification_topic("a", b"k"), notification_topic("b", b"k")
    ]
    assert registry.unregister("a", b"k") is True
    assert registry.unregister("a", b"k") is False
    assert registry.unregister("nobody", b"k") is False
    registry.drop_client("a")
    assert not registry.is_registered("a", b"other")
    assert [n.topic for n in registry.notifications(Change(b"k", None, V))] == [notification_topic("b", b"k")]
    registry.drop_client("b")
    assert registry.notifications(Change(b"k", None, V)) == []
    assert registry._by_key == {} and registry._by_client == {}  # nothing left behind


OPERATIONS = st.lists(st.tuples(st.sampled_from(["register", "unregister", "drop"]), st.sampled_from("ab"),
                                st.integers(0, 40), st.integers(0, 30_000)), max_size=120)


@given(OPERATIONS)
def test_registrations_stay_within_each_clients_quota_and_are_counted_exactly(operations: list[tuple[str, str, int, int]]) -> None:
    """Whatever a client registers, stops and drops, it holds at most the quota, and what the registry
    counts is what it holds (so STOP and a disconnect give the room back)."""
    registry = NotificationRegistry()
    for operation, client, index, length in operations:
        key = b"%d/" % index + b"k" * length
        if operation == "register":
            held = registry._by_client.get(client, set())
            fits = key in held or (len(held) < MAX_REGISTRATIONS_PER_CLIENT and
                                   sum(map(len, held)) + len(key) <= MAX_REGISTERED_KEY_BYTES_PER_CLIENT)
            assert registry.register(client, key) is fits
            assert registry.is_registered(client, key) is fits
        elif operation == "unregister":
            registry.unregister(client, key)
        else:
            registry.drop_client(client)
        for name, keys in registry._by_client.items():
            assert registry._key_bytes[name] == sum(map(len, keys)) <= MAX_REGISTERED_KEY_BYTES_PER_CLIENT
        assert set(registry._key_bytes) == set(registry._by_client)
