"""Start real gateway and mosquitto processes for tests, benchmarks and the HIL bench.

Both are started on port 0 / an OS-chosen port and report the port they actually bound, so any number of
them can run side by side. Readiness is an event (the gateway's ``appliance ready`` line, mosquitto
accepting a TCP connection), never a fixed sleep.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from testing.waiting import WaitTimeout, wait_until

READY_PATTERN = re.compile(r"appliance ready.*?(?:tcp|tls)://([0-9.]+):(\d+)")
ROOT = Path(__file__).resolve().parents[1]


def ephemeral_ports() -> range:
    """The range the kernel picks from for ``bind(0)`` and for every outgoing connection's local port."""
    try:
        low, high = (int(bound) for bound in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def _own_ports() -> range:
    """The ports this test process picks from: below the ephemeral range, one block per xdist worker.

    A port the kernel handed out by ``bind(0)`` and that was closed again goes straight back to the
    ephemeral pool, where any of the suite's thousands of client connections may get it as its local
    port before the peer binds it (CI saw our gateway's config port taken that way). Outside that pool
    only another ``free_port`` caller can take it, and the other workers pick from other blocks.
    """
    floor, ceiling = 10000, min(ephemeral_ports().start, 65536)
    if ceiling - floor < 2000:
        return range(0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    blocks = 32
    size = (ceiling - floor) // blocks
    start = floor + (index % blocks) * size
    return range(start, start + size)


def free_port() -> int:
    """A port nothing is bound to, for peers that must be told their port before they start (mosquitto,
    a gateway config file, QEMU's forwarding); readiness still has to be checked where the peer starts."""
    candidates = list(_own_ports())
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def password_file(path: Path, users: Mapping[str, str], iterations: int | None = None) -> Path:
    """A mosquitto-compatible password file with an entry per user (name -> password), written by
    ``appliance passwd`` itself (so the file is what an operator's would be); ``iterations`` lowers the
    hashing cost for tests that log in often."""
    cost = [] if iterations is None else ["-I", str(iterations)]
    for index, (user, password) in enumerate(users.items()):
        create = ["-c"] if index == 0 else []
        subprocess.run([sys.executable, "-m", "appliance", "passwd", *create, "-b", *cost, str(path), user, password],
                       check=True, capture_output=True, cwd=ROOT)
    return path


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> None:
    def accepts() -> bool:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False

    wait_until(accepts, timeout, f"a listener accepting connections on {host}:{port}")


class GatewayProcess:
    """Our gateway as a real child process (``python -m appliance run``).

    ``kill9()`` is the power cut of the durability tests; ``start()`` again reuses the same data dir and,
    unless ``port`` was 0 at first, the same port, so clients can reconnect to where they were.
    """

    def __init__(
        self,
        data_dir: Path,
        config: Path | None = None,
        port: int = 0,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.config = config
        self.port = port
        self.extra_args = list(extra_args)
        self.env = env
        self.process: subprocess.Popen[str] | None = None
        self.log_lines: list[str] = []
        self._log_lock = threading.Lock()
        self._ready = False

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "appliance", "run", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data_dir)]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        return cmd + self.extra_args

    def start(self, timeout: float = 60.0) -> GatewayProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.env:
            env.update(self.env)
        self.process = subprocess.Popen(
            self.command(), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        settled = threading.Event()
        self._ready = False
        threading.Thread(target=self._pump_output, args=(self.process, settled), daemon=True).start()
        settled.wait(timeout)
        if not self._ready or self.process.poll() is not None:
            output = self.output()
            self.kill9()
            why = "stopped before it was ready" if settled.is_set() else f"did not become ready within {timeout}s"
            raise RuntimeError(f"gateway {why}:\n{output}")
        return self

    def _pump_output(self, process: subprocess.Popen[str], settled: threading.Event) -> None:
        """Collect the log; ``settled`` on the ready line or when the output closes. Only the ready line
        makes the start good: a process whose output has closed is exiting, yet may not be reaped, so
        ``poll()`` can still say it runs (a gateway that failed to bind its port passed for started)."""
        assert process.stdout is not None
        for line in process.stdout:
            with self._log_lock:
                self.log_lines.append(line)
            match = READY_PATTERN.search(line)
            if match and not self._ready:
                self.port = int(match.group(2))
                self._ready = True
                settled.set()
        settled.set()

    def output(self) -> str:
        with self._log_lock:
            return "".join(self.log_lines)

    def wait_for_log(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        """Wait until a log line matches ``pattern``; the gateway's log is the event source."""
        regex = re.compile(pattern)
        found: list[re.Match[str]] = []

        def matched() -> bool:
            with self._log_lock:
                found.extend(match for line in self.log_lines if (match := regex.search(line)))
            return bool(found)

        wait_until(matched, timeout, lambda: f"a log line matching {pattern!r}; the log:\n{self.output()}")
        return found[0]

    def kill9(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait: the clean shutdown path."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def __enter__(self) -> GatewayProcess:
        return self.start() if self.process is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.kill9()


def stop_child(process: subprocess.Popen[Any] | None, grace_s: float = 5.0) -> None:
    """SIGTERM a child that still runs, and SIGKILL it if it has not exited within ``grace_s``."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace_s)


class MosquittoProcess:
    """The reference broker (Debian's mosquitto) with a config written into ``work_dir``."""

    def __init__(self, work_dir: Path, extra_config: str = "", port: int | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.extra_config = extra_config
        self.port_chosen_by_caller = port is not None
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"

    def start(self, timeout: float = 10.0, attempts: int = 3) -> MosquittoProcess:
        """Start and wait until the mosquitto process itself listens on the port.

        A port from ``free_port()`` can be taken by another process before mosquitto binds it; a plain
        "something accepts connections" check would then report that other program as our broker. So we
        wait until mosquitto's own process holds the listening socket, and pick another port when the bind
        failed (unless the caller chose the port).
        """
        for attempt in range(attempts):
            if self._start_once(timeout):
                return self
            if self.port_chosen_by_caller or attempt == attempts - 1:
                break
            self.port = free_port()
        raise RuntimeError(f"mosquitto did not start listening on {self.host}:{self.port}:\n{self.log_text()}")

    @property
    def log_path(self) -> Path:
        return self.work_dir / f"mosquitto-{self.port}.log"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _start_once(self, timeout: float) -> bool:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        conf = self.work_dir / f"mosquitto-{self.port}.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"log_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
            f"{self.extra_config}\n"
        )
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
        process = self.process
        try:
            wait_until(lambda: process.poll() is not None or self._owns_listening_socket(), timeout, "mosquitto listening")
        except WaitTimeout:
            self.stop()
            return False
        return process.poll() is None

    def _owns_listening_socket(self) -> bool:
        """Whether mosquitto itself listens on our port: its log line comes before bind(), and a plain
        connect could reach whoever else holds the port."""
        assert self.process is not None
        try:
            sockets = psutil.Process(self.process.pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            return False
        return any(sock.status == psutil.CONN_LISTEN and sock.laddr.port == self.port for sock in sockets)

    def stop(self) -> None:
        stop_child(self.process)

    def __enter__(self) -> MosquittoProcess:
        """Started once: ``with MosquittoProcess(d).start() as m`` used to start a second mosquitto here and
        leave the first one running after the test, as GatewayProcess does not."""
        return self.start() if self.process is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
