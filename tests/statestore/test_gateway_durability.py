"""kill -9 and restart: every acknowledged change is there (with its version and fencing token), and
connected clients find their way back."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest

from appliance.statestore.client import (
    FencingTokenLower,
    FencingTokenRequired,
    Notification,
    StateStoreClient,
)
from appliance.statestore.hlc import Hlc
from testing.processes import GatewayProcess


def test_acknowledged_changes_survive_kill_9(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data")
    try:
        gateway.start()
        with StateStoreClient(gateway.host, gateway.port, timeout=5) as client:
            versions = {}
            for index in range(50):
                versions[b"k%d" % index] = client.set(b"k%d" % index, b"v%d" % index).version
            for index in range(0, 50, 5):
                assert client.delete(b"k%d" % index).count == 1
                del versions[b"k%d" % index]
            lock = client.lease(b"lock", b"active", ttl_ms=600_000)
            assert lock.acquire()
            token = lock.fencing_token
            protected = client.set(b"protected", b"p", fencing_token=token).version
            highest = max([*versions.values(), protected])  # type: ignore[type-var]
        gateway.kill9()
        gateway.start()
        with StateStoreClient(gateway.host, gateway.port, timeout=5) as client:
            for k, version in versions.items():
                got = client.get(k)
                assert (got.value, got.version) == (b"v" + k[1:], version)
            for index in range(0, 50, 5):
                assert client.get(b"k%d" % index).value is None
            assert client.get(b"protected").version == protected
            with pytest.raises(FencingTokenRequired):
                client.set(b"protected", b"q")
            with pytest.raises(FencingTokenLower):
                client.set(b"protected", b"q", fencing_token=Hlc(token.wall_ms - 1, 0, "x"))  # type: ignore[union-attr]
            rival = client.lease(b"lock", b"standby", ttl_ms=1000)
            assert not rival.acquire()  # the lock survived with its holder
            # the clock resumed above everything it issued before the crash
            assert client.set(b"after", b"x").version > highest  # type: ignore[operator]
    finally:
        gateway.kill9()


def test_clients_reconnect_and_watch_again_after_a_gateway_restart(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data")
    try:
        gateway.start()
        watcher = StateStoreClient(gateway.host, gateway.port, timeout=5).connect()
        notes: queue.Queue[Notification] = queue.Queue()
        watcher.keynotify(b"watched", notes.put)
        restored = threading.Event()
        watcher.on_restored = restored.set
        gateway.kill9()
        gateway.start()  # same data dir, same port
        assert restored.wait(15), "the client did not reconnect and re-register"
        with StateStoreClient(gateway.host, gateway.port, timeout=5) as writer:
            writer.set(b"watched", b"after-restart")
        note = notes.get(timeout=5)
        assert (note.key, note.value) == (b"watched", b"after-restart")
        assert watcher.get(b"watched").value == b"after-restart"  # responses flow again too
        watcher.close()
    finally:
        gateway.kill9()
