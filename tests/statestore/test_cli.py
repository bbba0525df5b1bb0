"""``appliance state ...`` as a script would use it: JSON lines out, exit statuses, against a real gateway."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from unittest import mock

from appliance.cli import main
from appliance.statestore.hlc import Hlc
from testing.processes import ROOT, GatewayProcess

Key = Callable[[str], bytes]


def state(gateway: GatewayProcess | SimpleNamespace, *args: str, stdin: bytes | None = None) -> tuple[int, list[dict[str, Any]], str]:
    """Run ``appliance state ...`` in this process (``main`` as the console script calls it)."""
    verb, rest = args[0], args[1:]
    argv = ["state", verb, "--host", gateway.host, "--port", str(gateway.port), "--timeout", "5", *rest]
    out, err = io.StringIO(), io.StringIO()
    stdin_stream = io.TextIOWrapper(io.BytesIO(stdin or b""))
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), mock.patch.object(sys, "stdin", stdin_stream):
        code = main(argv)
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return code, lines, err.getvalue()


def test_set_get_del_round_trip(gateway: GatewayProcess, key: Key) -> None:
    k = key("k").decode()
    code, out, _ = state(gateway, "set", k, "hello", "--px", "60000")
    assert code == 0 and out[0]["applied"] is True
    version = Hlc.parse(out[0]["version"])
    code, out, _ = state(gateway, "set", k, "other", "--nx")
    assert code == 1 and out[0]["applied"] is False
    code, out, _ = state(gateway, "get", k)
    assert (code, out) == (0, [{"key": k, "found": True, "value": "hello", "version": str(version)}])
    code, out, _ = state(gateway, "vdel", k, "nope")
    assert code == 1 and out[0]["deleted"] == -1
    code, out, _ = state(gateway, "del", k)
    assert code == 0 and out[0]["deleted"] == 1
    code, out, _ = state(gateway, "get", k)
    assert code == 1 and out == [{"key": k, "found": False, "value": None, "version": None}]


def test_binary_value_from_stdin(gateway: GatewayProcess, key: Key) -> None:
    k = key("k").decode()
    assert state(gateway, "set", k, "-", stdin=b"\xff\x00bin")[0] == 0
    code, out, _ = state(gateway, "get", k)
    assert code == 0 and out[0]["value_base64"] == "/wBiaW4="


def test_service_errors_exit_2_with_the_error_text(gateway: GatewayProcess, key: Key) -> None:
    k = key("k").decode()
    token = str(Hlc(1_700_000_000_000, 5, "lock"))
    assert state(gateway, "set", k, "v", "--fencing-token", token)[0] == 0
    code, out, err = state(gateway, "del", k)
    assert (code, out, err.strip()) == (2, [], "-ERR a fencing token is required for this request")
    assert state(gateway, "del", k, "--fencing-token", token)[0] == 0


def test_lock_and_connection_failure(gateway: GatewayProcess, key: Key) -> None:
    k = key("lock").decode()
    code, out, _ = state(gateway, "lock", k, "--holder", "a", "--ttl", "60000")
    assert code == 0 and out[0]["acquired"] is True and Hlc.parse(out[0]["fencing_token"])
    code, out, _ = state(gateway, "lock", k, "--holder", "b", "--ttl", "60000")
    assert code == 1 and out == [{"key": k, "acquired": False}]
    short = key("short").decode()
    assert state(gateway, "lock", short, "--holder", "a", "--ttl", "500")[0] == 0
    code, out, _ = state(gateway, "lock", short, "--holder", "b", "--wait", "10")  # waits for the expiry
    assert code == 0 and out[0]["acquired"] is True
    nobody = SimpleNamespace(host="127.0.0.1", port=1)  # a port nobody listens on
    code, out, err = state(nobody, "get", k)
    assert code == 3 and out == [] and "cannot connect" in err


def test_watch_prints_changes(gateway: GatewayProcess, key: Key) -> None:
    """A real ``python -m appliance state watch`` process: the console entry point end to end."""
    k = key("k").decode()
    command = [sys.executable, "-m", "appliance", "state", "watch", k, "--port", str(gateway.port), "--count", "2"]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) as watcher:
        try:
            assert watcher.stdout is not None
            assert json.loads(watcher.stdout.readline())["watching"] is True  # registered: changes now count
            state(gateway, "set", k, "v1")
            state(gateway, "del", k)
            lines = [json.loads(watcher.stdout.readline()) for _ in range(2)]
            assert [(line["operation"], line["value"]) for line in lines] == [("SET", "v1"), ("DELETE", None)]
            assert watcher.wait(10) == 0
        finally:
            watcher.kill()
