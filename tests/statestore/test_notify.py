"""KEYNOTIFY registrations and the notification topic/payload formats."""

from __future__ import annotations

from appliance.statestore.hlc import Hlc
from appliance.statestore.notify import (
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
