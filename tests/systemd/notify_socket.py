"""A stand-in for systemd's end of NOTIFY_SOCKET: a real AF_UNIX datagram socket read on a thread."""

from __future__ import annotations

import socket
import threading
import time


class NotifySocket:
    """Receives datagrams on a thread and stamps each with its arrival time."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def wait_for(self, count: int, timeout: float = 5.0) -> list[tuple[float, str]]:
        deadline = time.monotonic() + timeout
        while len(self.messages) < count:
            assert time.monotonic() < deadline, f"got {self.messages}"
            time.sleep(0.005)
        return list(self.messages)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()
