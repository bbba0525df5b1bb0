"""A booted gateway root under ``systemd-nspawn --boot``, for ``tests/images/test_nspawn_boot.py``.

The root built by ``images/gateway/build_root.py`` is shared by every run (cached), so the container never
writes to it: ``--volatile=overlay`` keeps the boot's changes in RAM. What a real gateway keeps across
power cycles is bound in from host directories that outlive one boot: ``/etc/appliance`` (provisioning
writes it), ``/var/lib/appliance`` (the data), and ``/boot/firmware`` (the technician's files).

Two units cannot work in a container and are masked by binding ``/dev/null`` over them:
``systemd-remount-fs`` (there is no fstab root to remount) and ``systemd-networkd-wait-online`` (no link
comes up in a private network namespace). Nothing else of the root is changed.

Networking: ``--private-network`` gives the container only its own loopback, so its port 1883 collides
with nothing on the build machine. ``Forwarder`` reaches it from the host: it listens on a host loopback
port and opens each connection from a thread that has joined the container's network namespace
(``setns(2)`` is per thread), so paho and the state store client in the test connect to a host port.
Commands run inside with ``nsenter`` into the container's init: no machined is needed on the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psutil

CLONE_NEWNET = 0x40000000
MASKED_UNITS = ("systemd-remount-fs.service", "systemd-networkd-wait-online.service")


class Container:
    def __init__(self, root: Path, state: Path, binds_ro: dict[str, Path] | None = None) -> None:
        """``state`` holds the directories bound in (``etc``, ``data``, ``boot``), kept across boots."""
        self.root = root
        self.state = state
        self.binds_ro = binds_ro or {}
        self.name = f"s8img-{uuid.uuid4().hex[:8]}"
        self.process: subprocess.Popen[bytes] | None = None
        self.leader: int | None = None
        self.console = state / "console.log"

    def command(self) -> list[str]:
        binds = [
            f"--bind={self.state / 'etc'}:/etc/appliance",
            f"--bind={self.state / 'data'}:/var/lib/appliance",
            f"--bind={self.state / 'boot'}:/boot/firmware",
            *(f"--bind-ro=/dev/null:/etc/systemd/system/{unit}" for unit in MASKED_UNITS),
            *(f"--bind-ro={source}:{target}" for target, source in self.binds_ro.items()),
        ]
        return [
            "systemd-nspawn", "--quiet", "--boot", f"--directory={self.root}", f"--machine={self.name}",
            "--volatile=overlay", "--private-network", "--register=no", "--keep-unit", "--console=passive",
            *binds,
        ]

    def boot(self, timeout: float = 120.0) -> float:
        """Start the container and wait until systemd says the boot is over; returns the seconds it took."""
        started = time.monotonic()
        with self.console.open("ab") as console:
            self.process = subprocess.Popen(self.command(), stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.leader = self._wait_for_leader(timeout)
        state = self.run("systemctl", "is-system-running", "--wait", timeout=timeout, check=False).stdout.strip()
        if state not in ("running", "degraded"):
            raise RuntimeError(f"boot ended in state {state!r}:\n{self.console.read_text(errors='replace')}")
        return time.monotonic() - started

    def _wait_for_leader(self, timeout: float) -> int:
        """The container's init: nspawn's child whose PID namespace is not ours, running systemd."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        own = os.readlink("/proc/self/ns/pid")
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited with {self.process.returncode}:\n{self.console.read_text(errors='replace')}")
            for child in psutil.Process(self.process.pid).children(recursive=True):
                try:
                    # systemctl needs the manager's private socket: wait until init has created it.
                    if (
                        os.readlink(f"/proc/{child.pid}/ns/pid") != own
                        and child.name() == "systemd"
                        and Path(f"/proc/{child.pid}/root/run/systemd/private").exists()
                    ):
                        return child.pid
                except (OSError, psutil.Error):
                    continue
            time.sleep(0.05)
        raise TimeoutError(f"no container init within {timeout} s")

    def run(self, *command: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside the container (its mount, PID, network, IPC and UTS namespaces, as root)."""
        assert self.leader is not None
        result = subprocess.run(
            ["nsenter", f"--target={self.leader}", "--mount", "--uts", "--ipc", "--net", "--pid", "--", *command],
            capture_output=True, text=True, timeout=timeout,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"},
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited with {result.returncode}:\n{result.stdout}{result.stderr}")
        return result

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        output = self.run("systemctl", "show", unit, *(f"--property={name}" for name in properties)).stdout
        return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)

    def journal(self, unit: str) -> str:
        return self.run("journalctl", "--no-pager", "-o", "cat", "-b", "-u", unit, check=False).stdout

    def power_cut(self) -> None:
        """SIGKILL to the container's init: every process in it dies at once, nothing is shut down."""
        assert self.leader is not None and self.process is not None
        os.kill(self.leader, signal.SIGKILL)
        self.process.wait(30)
        self.leader = None

    def shutdown(self, timeout: float = 60.0) -> None:
        """An orderly poweroff (nspawn passes SIGTERM on as the container's shutdown request)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.leader = None


_libc = ctypes.CDLL(None, use_errno=True)


class Forwarder:
    """A host loopback port whose connections reach ``port`` inside another network namespace."""

    def __init__(self, leader: int, port: int) -> None:
        self._netns = os.open(f"/proc/{leader}/ns/net", os.O_RDONLY)
        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closing = False
        self._dial_requests: list[tuple[socket.socket, threading.Event, list[socket.socket | OSError]]] = []
        self._dial_ready = threading.Condition()
        threading.Thread(target=self._dialer, name="netns-dialer", daemon=True).start()
        threading.Thread(target=self._accept, name="netns-accept", daemon=True).start()

    def _dialer(self) -> None:
        """This thread lives in the container's network namespace and opens every outbound connection."""
        if _libc.setns(self._netns, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the container's network namespace failed")
        while True:
            with self._dial_ready:
                self._dial_ready.wait_for(lambda: self._dial_requests or self._closing)
                if self._closing:
                    return
                _, done, result = self._dial_requests.pop(0)
            try:
                result.append(socket.create_connection(("127.0.0.1", self._target), timeout=5))
            except OSError as exc:
                result.append(exc)
            done.set()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            done = threading.Event()
            result: list[socket.socket | OSError] = []
            with self._dial_ready:
                self._dial_requests.append((client, done, result))
                self._dial_ready.notify_all()
            done.wait(10)
            upstream = result[0] if result else None
            if not isinstance(upstream, socket.socket):
                client.close()
                continue
            upstream.settimeout(None)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        with self._dial_ready:
            self._dial_ready.notify_all()
        os.close(self._netns)
