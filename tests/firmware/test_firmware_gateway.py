"""The gateway's side of over-the-air updates without sockets: request parsing, the queue, the repository."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from hypothesis import given
from hypothesis import strategies as st

from appliance.firmware.protocol import (
    MAX_CHUNK,
    ChunkQueue,
    ChunkRequest,
    PendingChunk,
    RequestError,
    chunk_reply,
    group_members,
    parse_request,
)
from appliance.firmware.repository import BundleError, Repository, device_manifest, read_bundle, sign
from appliance.firmware.service import FirmwareService
from appliance.statestore import resp3


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
    assert 0 <= parsed.offset and 1 <= parsed.size


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
        accepted = queue.offer(client, PendingChunk("clients/x/r", b"c", str(serial).encode()))
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
