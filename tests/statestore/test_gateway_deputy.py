"""No in-process service is a confused deputy, end to end: a real gateway with a password file made by
``appliance passwd`` and a mosquitto-format ACL file, paho clients on real sockets.

A client that may read ``c/#`` but not write it asks the state store, and the firmware chunk service, to
answer on ``c/deputy``: the request is refused (PUBACK 0x87, DISCONNECT 0x87) and subscribers of
``c/deputy`` get nothing. (Every service, on a recording broker: ``tests/broker/test_request_envelope.py``.) A client
shaped like the SDKs (response topics under ``clients/<id>/`` or ``clients/<HEX(id)>/``, notifications on
``clients/statestore/v1/<system id>/<HEX(id)>/command/notify/...``) works under the same ACL file thanks
to the default ``acl_client_patterns``, with no rule about those topics in the file.
"""

from __future__ import annotations

import base64
import queue
import time
import uuid
from collections.abc import Iterator

import pytest

from appliance.firmware.protocol import REQUEST_TOPIC as FIRMWARE_REQUEST_TOPIC
from appliance.statestore.client import Notification, StateStoreClient
from appliance.statestore.commands import GetCommand, SetCommand
from appliance.statestore.hlc import Hlc
from appliance.statestore.notify import NOTIFY_TOPIC_PREFIX
from appliance.statestore.protocol import REQUEST_TOPIC
from appliance.statestore.resp3 import encode_array
from testing.processes import GatewayProcess, password_file
from tests.statestore.raw_mqtt import TIMEOUT, RawClient

# Who may use a service at all is its request topic's write rule; the rest is the point of the test.
ACL = """\
pattern write statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke
pattern write firmware/v1/command/chunk

user mallory
topic read c/#

user victim
topic readwrite c/#

user alice
topic readwrite alice/#
"""
USERS = {"mallory": "m-pass", "victim": "v-pass", "alice": "a-pass"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("deputy")
    passwords = password_file(work / "passwd", USERS, iterations=1000)
    (work / "acl").write_text(ACL)
    config = work / "gateway.toml"
    config.write_text(f'[broker.auth]\nallow_anonymous = false\npassword_file = "{passwords}"\n'
                      f'acl_file = "{work / "acl"}"\n')
    with GatewayProcess(work / "data", config=config) as process:
        yield process


def login(gateway: GatewayProcess, user: str, client_id: str | None = None) -> RawClient:
    return RawClient(gateway.host, gateway.port, client_id=client_id, username=user, password=USERS[user])


SERVICES = {
    "statestore": (REQUEST_TOPIC, GetCommand(b"k").encode()),
    # Unknown version: the answer (-ERR unknown version ...) would echo mallory's text to c/ subscribers.
    "firmware": (FIRMWARE_REQUEST_TOPIC, encode_array([b"CHUNK", b"mallory-says", b"app.mpy", b"0", b"64"])),
}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_client_cannot_make_a_service_write_where_it_may_not(secured: GatewayProcess, service: str) -> None:
    victim = login(secured, "victim")
    mallory = login(secured, "mallory")
    try:
        victim.subscribe("c/#")
        stamp = str(Hlc(time.time_ns() // 1_000_000, 0, "v"))
        victim.publish(REQUEST_TOPIC, SetCommand(b"k", b"payload of mallory's choosing").encode(),
                       response_topic="c/victim-own", correlation_data=b"v", user_properties=[("__ts", stamp)])
        assert victim.next_message().topic == "c/victim-own"  # victim may write c/#: answered there
        request_topic, payload = SERVICES[service]
        mid = mallory.publish(request_topic, payload, response_topic="c/deputy", correlation_data=b"1")
        assert mallory.pubacks.get(timeout=TIMEOUT) == (mid, 0x87)
        assert mallory.disconnects.get(timeout=TIMEOUT) == 0x87
        victim.publish("c/marker", b"marker")  # anything the deputy had sent would arrive before this
        assert victim.next_message().payload == b"marker"
    finally:
        mallory.close()
        victim.close()


def test_sdk_shaped_clients_work_under_the_acl_file_without_rules_for_their_topics(secured: GatewayProcess) -> None:
    alice = StateStoreClient(secured.host, secured.port, f"alice-{uuid.uuid4().hex[:8]}", username="alice",
                             password=USERS["alice"], timeout=5).connect()
    notes: queue.Queue[Notification] = queue.Queue()
    try:
        alice.keynotify(b"shared", notes.put)
        assert alice.set(b"shared", b"v1").applied
        assert alice.get(b"shared").value == b"v1"
        assert notes.get(timeout=TIMEOUT).value == b"v1"
    finally:
        alice.close()
    # The Go SDK's shape: response topic under clients/<HEX(client id)>/, notifications subscribed first.
    client_id = f"go-{uuid.uuid4().hex[:8]}"
    hex_id = base64.b16encode(client_id.encode()).decode()
    go = login(secured, "alice", client_id)
    try:
        response_topic = f"clients/{hex_id}/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response"
        go.subscribe(response_topic)
        go.subscribe(f"{NOTIFY_TOPIC_PREFIX}/{hex_id}/command/notify/+")
        go.publish(REQUEST_TOPIC, GetCommand(b"shared").encode(), response_topic=response_topic, correlation_data=b"g")
        reply = go.next_message()
        assert (reply.topic, reply.payload) == (response_topic, b"$2\r\nv1\r\n")
    finally:
        go.close()
