"""Start a rig program locally (the simulated bench's "pty" serial port) and always take it down again.

The bench waits for the rig's ready line rather than sleeping, and on the way out stops the rig with
SIGTERM (it removes its namespaces itself), escalates to SIGKILL if it hangs, and then deletes any
namespace the ready line named that is still there, so even a killed rig leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class RigStartError(RuntimeError):
    """The rig exited or stayed silent before printing its ready line; the message holds its stderr."""


def _read_ready_line(process: subprocess.Popen[bytes], log_path: Path, timeout: float) -> dict[str, Any]:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffered = b""
    while b"\n" not in buffered:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RigStartError(f"no ready line within {timeout} s; stderr: {log_path.read_text()[-2000:]}")
        readable, _, _ = select.select([process.stdout], [], [], remaining)
        if readable:
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                process.wait()
                raise RigStartError(f"rig exited with {process.returncode}; stderr: {log_path.read_text()[-2000:]}")
            buffered += chunk
    ready: dict[str, Any] = json.loads(buffered.split(b"\n", 1)[0])
    return ready


def _delete_leftover_namespaces(ready: dict[str, Any]) -> None:
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    names = {line.split()[0] for line in existing.splitlines() if line.strip()}
    for key in ("gateway_ns", "cloud_ns"):
        if ready.get(key) in names:
            subprocess.run(["ip", "netns", "del", ready[key]], check=False)


@contextlib.contextmanager
def local_rig(
    backend_args: Sequence[str], log_path: Path, serial_device: str = "pty", prefix: Sequence[str] = (),
    command: Sequence[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Run ``python -m hil_tests.rig --serial <serial_device> <backend_args>``; yield its ready line as a dict.

    With the default ``pty`` the rig creates the pty pair and ``ready["serial"]`` is the device to open.
    ``prefix`` runs it elsewhere, e.g. ``ip netns exec <rig namespace>`` (which execs, so the process is the rig).
    ``command`` replaces the whole command line after ``prefix`` (a rig started as its unit starts it).
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    argv = command if command is not None else [sys.executable, "-m", "hil_tests.rig", "--serial", serial_device,
                                                *backend_args]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*prefix, *argv],
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=REPO_ROOT,
            env=env,
        )
    ready: dict[str, Any] = {}
    try:
        ready = _read_ready_line(process, log_path, READY_TIMEOUT_S)
        yield ready
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()
        _delete_leftover_namespaces(ready)
