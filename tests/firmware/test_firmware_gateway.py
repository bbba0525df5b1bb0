"""The gateway's side of over-the-air updates without sockets: request parsing, the queue, the repository."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.api import InboundPublish, PublishVerdict
from appliance.broker.request_envelope import Request
from appliance.firmware.protocol import (
    MAX_CHUNK,
    REQUEST_TOPIC,
    ChunkQueue,
    ChunkRequest,
    PendingChunk,
    RequestError,
    chunk_reply,
    group_members,
    parse_request,
)
from appliance.firmware.repository import (
    BundleError,
    Repository,
    device_manifest,
    read_bundle,
)
from appliance.firmware.service import FirmwareService
from appliance.firmware.signing import sign
from appliance.statestore import resp3
from testing.campaigns import campaign


def bundle_file(path, modules: dict[str, bytes], version: str = "0.2.0", lie: str | None = None):
    files = [{"path": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in modules.items()]
    if lie:
        next(f for f in files if f["path"] == lie)["sha256"] = "0" * 64
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in modules.items():
            archive.writestr(name, data)
        archive.writestr("manifest.json", json.dumps({"name": "thermostat-fw", "version": version,
                                                      "mpy_version": 6, "files": files}))
    return path


def request(*args: bytes) -> bytes:
    return resp3.encode_array(list(args))


def test_a_chunk_request_names_version_file_offset_and_size():
    assert parse_request(request(b"CHUNK", b"0.2.0", b"app.mpy", b"384", b"384")) == ChunkRequest("0.2.0", "app.mpy", 384, 384)
    for payload, message in ((request(b"GET", b"k"), "unknown command"),
                             (request(b"CHUNK", b"0.2.0"), "wrong number of arguments"),
                             (request(b"CHUNK", b"../etc", b"app.mpy", b"0", b"1"), "version is not a name"),
                             (request(b"CHUNK", b"0.2.0", b".hidden", b"0", b"1"), "file is not a name"),
                             (request(b"CHUNK", b"0.2.0", b"a/b", b"0", b"1"), "file is not a name"),
                             (request(b"CHUNK", b"0.2.0", b"app.mpy", b"-1", b"1"), "offset must be a decimal number"),
                             (b"\xff", "syntax error")):
        with pytest.raises(RequestError, match=message.split(" (")[0]):
            parse_request(payload)


@given(st.binary(max_size=200))
def test_any_payload_is_a_request_or_a_request_error(payload):
    try:
        parsed = parse_request(payload)
    except RequestError:
        return
    assert parsed.offset >= 0 and parsed.size >= 1


@given(st.lists(st.tuples(st.sampled_from([f"t-{i}" for i in range(12)]), st.booleans()), max_size=200))
def test_the_queue_holds_one_request_per_client_and_never_more_than_its_limit(operations):
    queue = ChunkQueue(limit=8)
    model: dict[str, int] = {}
    for serial, (client, pop) in enumerate(operations):
        if pop:
            item = queue.pop()
            if model:
                oldest = next(iter(model))
                assert item is not None and item[0] == oldest and item[1].payload == str(model.pop(oldest)).encode()
            else:
                assert item is None
            continue
        accepted = queue.offer(client, PendingChunk(Request(client, None, "clients/x/r", b"c"), str(serial).encode()))
        assert accepted == (client in model or len(model) < 8)
        if accepted:
            model[client] = serial
        assert len(queue) == len(model) <= 8


def test_chunks_are_capped_and_short_at_the_end():
    data = bytes(range(256)) * 40
    assert resp3.decode(chunk_reply(data, ChunkRequest("v", "f", 0, 10**6))) == data[:MAX_CHUNK]
    assert resp3.decode(chunk_reply(data, ChunkRequest("v", "f", len(data) - 5, 384))) == data[-5:]
    assert resp3.decode(chunk_reply(data, ChunkRequest("v", "f", len(data) + 7, 384))) == b""


def test_a_bundle_is_stored_once_served_by_name_and_refused_if_it_lies(tmp_path):
    modules = {"app.mpy": b"M\x06app", "thermostat.mpy": b"M\x06" + bytes(1000)}
    bundle = read_bundle(bundle_file(tmp_path / "b.zip", modules))
    repo = Repository(tmp_path / "firmware")
    repo.store(bundle, None)
    assert repo.versions() == ["0.2.0"]
    manifest = repo.read("0.2.0", "manifest.txt")
    assert manifest == device_manifest(bundle)
    assert manifest.splitlines()[0] == b"thermostat-fw 0.2.0 6"
    assert manifest.splitlines()[2] == b"thermostat.mpy 1002 " + hashlib.sha256(modules["thermostat.mpy"]).hexdigest().encode()
    assert repo.read("0.2.0", "thermostat.mpy") == modules["thermostat.mpy"]
    assert repo.read("0.2.0", "../0.2.0/app.mpy") is None and repo.read("..", "app.mpy") is None
    repo.store(bundle, None)  # the same bytes again: fine
    other = read_bundle(bundle_file(tmp_path / "c.zip", {"app.mpy": b"M\x06other"}))
    with pytest.raises(BundleError, match="already published with other contents"):
        repo.store(other, None)
    with pytest.raises(BundleError, match="thermostat.mpy does not match"):
        read_bundle(bundle_file(tmp_path / "d.zip", modules, lie="thermostat.mpy"))
    with pytest.raises(BundleError, match="is not 1-32"):
        read_bundle(bundle_file(tmp_path / "e.zip", modules, version="../x"))


def test_a_version_another_publish_stored_meanwhile_is_judged_as_a_stored_one(tmp_path, monkeypatch):
    """Two publishes of one new version at once: the second rename finds the first's directory there."""
    bundle = read_bundle(bundle_file(tmp_path / "b.zip", {"app.mpy": b"M\x06app"}))
    other = read_bundle(bundle_file(tmp_path / "c.zip", {"app.mpy": b"M\x06other"}))
    real_rename = os.rename

    def another_publish_first(source, target):
        if not Path(target).exists():
            shutil.copytree(source, target)  # the other process's whole copy, renamed into place first
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", another_publish_first)
    assert Repository(tmp_path / "firmware").store(bundle, None) is False  # the same files: already stored
    with pytest.raises(BundleError, match="already published with other contents"):
        Repository(tmp_path / "other").store(bundle, None) or Repository(tmp_path / "other").store(other, None)
    assert [p.name for p in (tmp_path / "firmware").iterdir()] == ["0.2.0"]  # no staging copy left behind


def test_the_signature_is_ecdsa_p256_over_the_manifest_as_r_and_s():
    key = ec.generate_private_key(ec.SECP256R1())
    signature = sign(b"thermostat-fw 0.2.0 6\n", key)
    assert len(signature) == 64
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
    key.public_key().verify(der, b"thermostat-fw 0.2.0 6\n", ec.ECDSA(hashes.SHA256()))


def test_the_service_answers_every_request_with_a_chunk_or_an_error(tmp_path):
    service = FirmwareService(tmp_path)
    service.repository.store(read_bundle(bundle_file(tmp_path / "b.zip", {"app.mpy": b"M\x06app"})), None)
    assert resp3.decode(service.answer(request(b"CHUNK", b"0.2.0", b"app.mpy", b"1", b"3"))) == b"\x06ap"
    assert service.answer(request(b"CHUNK", b"0.3.0", b"app.mpy", b"0", b"3")) == b"-ERR unknown version 0.3.0\r\n"
    assert service.answer(request(b"CHUNK", b"0.2.0", b"manifest.sig", b"0", b"64")).startswith(b"-ERR no such file")


def test_group_members_are_names():
    assert group_members(b"t-01, t-02 t-03") == ["t-01", "t-02", "t-03"]
    with pytest.raises(ValueError, match="not a thermostat name"):
        group_members(b"t-01 a/b")


class RecordingBroker:
    """The BrokerHandle the service publishes its replies through, recording them."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, int, bytes | None]] = []

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, **props: Any) -> None:
        self.published.append((topic, payload, qos, props.get("correlation_data")))

    def disconnect(self, client_id: str, reason_code: int, reason_string: str | None = None) -> None:
        raise AssertionError("the firmware service disconnects nobody")

    def may_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return True  # no acl_file (the deputy tests, tests/broker/test_request_envelope.py, have one)

    def serves(self, topic: str) -> bool:
        return topic == REQUEST_TOPIC


def inbound(client: str, payload: bytes, response_topic: str | None = "clients/c/r", correlation: bytes | None = b"1",
            qos: int = 1, level: int = 5) -> InboundPublish:
    return InboundPublish(client_id=client, username=None, protocol_level=level, topic=REQUEST_TOPIC,
                          payload=payload, qos=qos, retain=False, response_topic=response_topic,
                          correlation_data=correlation)


def test_envelopes_are_checked_like_the_state_stores(tmp_path):
    async def scenario() -> list[PublishVerdict]:
        service = FirmwareService(tmp_path, queue_limit=1)
        await service.start(RecordingBroker())
        good = request(b"CHUNK", b"0.2.0", b"app.mpy", b"0", b"8")
        return [await service.on_publish(message) for message in (
            inbound("a", good, response_topic="clients/a/#"), inbound("a", good, level=4), inbound("a", good, qos=0),
            inbound("a", good, response_topic=None), inbound("a", good, correlation=None),
            inbound("a", good), inbound("b", good))]

    verdicts = asyncio.run(scenario())
    assert [(v.reason_code, v.disconnect) for v in verdicts] == [
        (0x90, 0x90), (0x83, None), (0x83, None), (0x83, None), (0x83, None), (0, None), (0x97, None)]
    assert not any(v.route for v in verdicts)


@campaign(60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["t-1", "t-2", "t-3"]),
                          st.one_of(st.binary(max_size=60),
                                    st.builds(lambda v, f, o, n: request(b"CHUNK", v, f, o, n),
                                              st.sampled_from([b"0.2.0", b"0.3.0", b"..", b""]),
                                              st.sampled_from([b"app.mpy", b"manifest.txt", b"x/y", b"\xff"]),
                                              st.sampled_from([b"0", b"5", b"99999", b"-1", b"1e3"]),
                                              st.sampled_from([b"1", b"384", b"0", b"999999999999"])))),
                min_size=1, max_size=30))
def test_hostile_requests_never_crash_the_worker_and_each_reply_answers_one_accepted_request(tmp_path_factory, requests):
    data_dir = tmp_path_factory.mktemp("fw")
    bundle = bundle_file(data_dir / "b.zip", {"app.mpy": b"M\x06" + bytes(range(200))})

    async def scenario() -> tuple[list[PublishVerdict], RecordingBroker, FirmwareService]:
        service = FirmwareService(data_dir, queue_limit=2)
        service.repository.store(read_bundle(bundle), None)
        broker = RecordingBroker()
        await service.start(broker)
        verdicts = []
        for serial, (client, payload) in enumerate(requests):
            verdicts.append(await service.on_publish(inbound(client, payload, f"clients/{client}/r", b"%d" % serial)))
            assert len(service.queue) <= 2
            if serial % 3 == 0:
                await asyncio.sleep(0)
        for _ in range(10):
            await asyncio.sleep(0)
        await service.stop()
        return verdicts, broker, service

    verdicts, broker, service = asyncio.run(scenario())
    accepted = [str(i).encode() for i, v in enumerate(verdicts) if v.reason_code == 0]
    answered = [corr for _, _, _, corr in broker.published]
    # Every reply answers an accepted request, at most once; a client's newer request may replace its older.
    assert len(answered) == len(set(answered)) and set(answered) <= set(accepted)
    for _, payload, qos, _ in broker.published:
        assert qos == 1
        value = resp3.decode(payload)
        assert isinstance(value, (bytes, resp3.ErrorReply)), value
        assert not isinstance(value, bytes) or len(value) <= MAX_CHUNK
    assert len(service.queue) == 0
