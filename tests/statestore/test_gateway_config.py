"""A gateway with a non-default ``[statestore]``: per-user key ACLs, quotas, node id and sync level."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.statestore.client import NotAuthorized, QuotaExceeded, StateStoreClient
from testing.processes import GatewayProcess

CONFIG = """
[statestore]
node_id = "gw-test"
sync = "full"
max_keys = 3
max_bytes = 100000

[[statestore.acl]]
user = "alice"
prefix = "alice/"
access = ["read", "write"]

[[statestore.acl]]
user = "*"
prefix = "shared/"
access = ["read", "write"]

[[statestore.acl]]
user = "*"
prefix = "alice/public"
access = ["read"]
"""


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("configured")
    config = folder / "gateway.toml"
    config.write_text(CONFIG)
    with GatewayProcess(folder / "data", config=config) as process:
        yield process


def client_for(gateway: GatewayProcess, username: str | None) -> StateStoreClient:
    return StateStoreClient(gateway.host, gateway.port, username=username, password="pw" if username else None, timeout=5)


def test_key_prefix_acl_per_user(configured: GatewayProcess) -> None:
    with client_for(configured, "alice") as alice, client_for(configured, "bob") as bob:
        assert alice.set("alice/x", b"1").applied
        assert alice.set("alice/public/y", b"2").applied
        with pytest.raises(NotAuthorized):
            bob.get("alice/x")
        with pytest.raises(NotAuthorized):
            bob.set("alice/x", b"mine")
        with pytest.raises(NotAuthorized):
            bob.keynotify("alice/x", lambda note: None)
        assert bob.get("alice/public/y").value == b"2"
        with pytest.raises(NotAuthorized):
            bob.delete("alice/public/y")
        with pytest.raises(NotAuthorized):
            alice.set("elsewhere", b"1")
        assert alice.get("alice/x").value == b"1"  # the refusals changed nothing
        assert alice.delete("alice/x").count == 1 and alice.delete("alice/public/y").count == 1


def test_key_quota_and_node_id(configured: GatewayProcess) -> None:
    with client_for(configured, None) as anyone:
        versions = [anyone.set(f"shared/{index}", b"v").version for index in range(3)]
        assert all(version is not None and version.node_id == "gw-test" for version in versions)
        with pytest.raises(QuotaExceeded):
            anyone.set("shared/3", b"v")
        assert anyone.set("shared/0", b"replaced").applied  # replacing needs no new key
        assert anyone.delete("shared/2").count == 1
        assert anyone.set("shared/3", b"v").applied
        for index in (0, 1, 3):
            anyone.delete(f"shared/{index}")


def test_the_database_lives_in_the_data_dir(configured: GatewayProcess) -> None:
    assert (Path(configured.data_dir) / "statestore.db").exists()
