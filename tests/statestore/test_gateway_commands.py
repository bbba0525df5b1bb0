"""Every command, option, response and error string over real MQTT 5, against a gateway process.

The scenario numbers refer to the list at the top of the Azure IoT Operations SDK's Rust
``state_store_client_test.rs``, ported here as our own tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from appliance.statestore import errors
from appliance.statestore.client import (
    FencingTokenLower,
    FencingTokenRequired,
    FencingTokenSkew,
    MalformedTimestamp,
    MissingTimestamp,
    StateStoreClient,
    TimestampSkew,
)
from appliance.statestore.client.results import raise_for_error
from appliance.statestore.commands import Condition, SetCommand
from appliance.statestore.hlc import Hlc
from appliance.statestore.resp3 import encode_array

Key = Callable[[str], bytes]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_basic_set_and_delete(client: StateStoreClient, key: Key) -> None:  # scenarios 1, 2, 6, 15, 19
    k = key("k")
    first = client.set(k, b"value1")
    assert first.applied and first.version is not None
    second = client.set(k, b"value2")
    assert second.applied and second.version > first.version  # type: ignore[operator]
    got = client.get(k)
    assert (got.value, got.version) == (b"value2", second.version)
    deleted = client.delete(k)
    assert (deleted.count, deleted.version) == (1, second.version)


def test_key_not_found(client: StateStoreClient, key: Key) -> None:  # scenarios 14, 16, 21
    k = key("never")
    assert client.get(k).value is None and client.get(k).version is None
    assert client.delete(k).count == 0
    assert client.vdelete(k, b"x").count == 0


def test_set_conditions(client: StateStoreClient, key: Key) -> None:  # scenarios 8-12
    k = key("k")
    assert client.set(k, b"v1", condition=Condition.NX).applied
    refused = client.set(k, b"v2", condition=Condition.NX)
    assert not refused.applied and refused.version is not None  # ":-1", and __ts in both outcomes
    assert client.set(k, b"v1", condition=Condition.NEX).applied  # equal value
    assert not client.set(k, b"other", condition=Condition.NEX).applied
    assert client.get(k).value == b"v1"
    assert client.set(key("fresh"), b"v", condition=Condition.NEX).applied  # missing key


def test_vdel(client: StateStoreClient, key: Key) -> None:  # scenarios 20, 22, 25
    k = key("k")
    version = client.set(k, b"v").version
    mismatch = client.vdelete(k, b"not-v")
    assert (mismatch.count, mismatch.version) == (-1, version)
    assert client.get(k).value == b"v"
    assert client.vdelete(k, b"v").count == 1
    assert client.get(k).value is None


def test_fencing_tokens(client: StateStoreClient, key: Key) -> None:  # scenarios 3, 4, 5, 7, 13, 17, 18, 23, 24
    k = key("protected")
    token = Hlc(now_ms(), 0, "lock")
    first = client.set(k, b"value3", fencing_token=token, expire_ms=10_000)
    assert first.applied
    assert client.set(k, b"value4", fencing_token=first.version, expire_ms=10_000).applied
    with pytest.raises(FencingTokenRequired):
        client.set(k, b"value5")
    with pytest.raises(FencingTokenLower):
        client.set(k, b"value5", fencing_token=Hlc(token.wall_ms - 1, 0, "lock"))
    assert client.get(k).value == b"value4"  # GET needs no token
    with pytest.raises(FencingTokenRequired):
        client.delete(k)
    with pytest.raises(FencingTokenRequired):
        client.vdelete(k, b"value4")
    with pytest.raises(FencingTokenLower):
        client.vdelete(k, b"value4", fencing_token=token)
    assert client.delete(k, fencing_token=first.version).count == 1


def test_response_properties_on_the_wire(client: StateStoreClient, key: Key) -> None:
    k = key("k")
    sent = Hlc(now_ms(), 3, "me")
    reply = client.request(SetCommand(k, b"v").encode(), [("__ts", str(sent))], stamp=False)
    props = dict(reply.user_properties)
    assert reply.payload == b"+OK\r\n" and props["__stat"] == "200" and props["__protVer"] == "1.0"
    assert len(props["__ts"].split(":")[0]) == 15 and len(props["__ts"].split(":")[1]) == 5  # zero padded
    assert Hlc.parse(props["__ts"]) > sent
    miss = client.request(encode_array([b"GET", key("none")]), stamp=False)
    assert miss.payload == b"$-1\r\n" and dict(miss.user_properties) == {"__stat": "200", "__protVer": "1.0"}
    assert client.request(encode_array([b"DEL", k]), stamp=False).payload == b":1\r\n"


def test_lower_case_verbs_are_accepted(client: StateStoreClient, key: Key) -> None:
    k = key("k")
    assert client.request(encode_array([b"set", k, b"VALUE5", b"nx", b"px", b"60000"])).payload == b"+OK\r\n"
    assert client.request(encode_array([b"get", k])).payload == b"$6\r\nVALUE5\r\n"
    assert client.request(encode_array([b"vdel", k, b"ABC"])).payload == b":-1\r\n"
    assert client.request(encode_array([b"del", k])).payload == b":1\r\n"


def test_binary_keys_and_large_values(client: StateStoreClient) -> None:
    k = bytes(range(256))
    value = bytes(range(256)) * 400  # ~100 KB, CRLFs and NULs included
    assert client.set(k, value).applied
    assert client.get(k).value == value
    assert client.delete(k).count == 1


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", errors.SYNTAX_ERROR),
        (b"*2\r\n$3\r\nGET\r\n$9\r\nk\r\n", errors.SYNTAX_ERROR),
        (b"*2\r\n$3\r\nGET\r\n$-7\r\nk\r\n", errors.SYNTAX_ERROR),
        (b"*99999999999999999999999\r\n", errors.SYNTAX_ERROR),
        (b"+SET\r\n", errors.SYNTAX_ERROR),
        (encode_array([b"HGET", b"k"]), errors.UNKNOWN_COMMAND),
        (encode_array([b"GET"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"VDEL", b"k"]), errors.WRONG_NUMBER_OF_ARGUMENTS),
        (encode_array([b"GET", b""]), errors.KEY_LENGTH_ZERO),
        (encode_array([b"SET", b"k", b"v", b"PX", b"0"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"PX", b"2.5"]), errors.SYNTAX_ERROR),
        (encode_array([b"SET", b"k", b"v", b"NX", b"NEX"]), errors.SYNTAX_ERROR),
    ],
)
def test_payload_errors(client: StateStoreClient, payload: bytes, message: str) -> None:
    reply = client.request(payload)
    assert reply.payload == f"-ERR {message}\r\n".encode()
    assert dict(reply.user_properties) == {"__stat": "200", "__protVer": "1.0"}


def test_timestamp_errors_and_clock_skew(client: StateStoreClient, key: Key) -> None:
    k = key("k")
    set_k = SetCommand(k, b"v").encode()
    with pytest.raises(MissingTimestamp):
        raise_for_error(client.request(set_k, stamp=False))
    with pytest.raises(MalformedTimestamp):
        raise_for_error(client.request(set_k, [("__ts", "12:ab:c")], stamp=False))
    with pytest.raises(MalformedTimestamp):
        raise_for_error(client.request(set_k, [("__ft", "nonsense")]))
    with pytest.raises(TimestampSkew) as caught:
        raise_for_error(client.request(set_k, [("__ts", str(Hlc(now_ms() + 61_000, 0, "c")))], stamp=False))
    assert caught.value.message == errors.TIMESTAMP_SKEW
    with pytest.raises(FencingTokenSkew):
        raise_for_error(client.request(set_k, [("__ft", str(Hlc(now_ms() + 61_000, 0, "c")))]))
    assert client.get(k).value is None  # nothing above was stored
    ahead = Hlc(now_ms() + 50_000, 0, "c")  # within the minute: accepted, and the version follows it
    reply = client.request(set_k, [("__ts", str(ahead))], stamp=False)
    assert reply.payload == b"+OK\r\n" and reply.version is not None and reply.version > ahead
    behind = Hlc(now_ms() - 3_600_000, 0, "c")  # an hour behind: accepted, the version is the gateway's clock
    late = client.request(set_k, [("__ts", str(behind))], stamp=False)
    assert late.payload == b"+OK\r\n" and late.version > reply.version  # type: ignore[operator]


def test_ambient_timestamp_on_get_is_accepted(client: StateStoreClient, key: Key) -> None:
    """The SDK invokers put __ts on every request; GET, DEL and VDEL must accept it."""
    k = key("k")
    client.set(k, b"v")
    assert client.request(encode_array([b"GET", k])).payload == b"$1\r\nv\r\n"
