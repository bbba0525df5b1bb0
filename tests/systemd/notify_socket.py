"""A stand-in for systemd's end of NOTIFY_SOCKET: a real AF_UNIX datagram socket read on a thread."""

from __future__ import annotations

import socket
import threading
import time
import uuid

from testing.waiting import wait_until


class NotifySocket:
    """Receives datagrams on a thread and stamps each with its arrival time."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._markers: set[str] = set()  # barrier datagrams sent, and those that arrived
        self._arrived: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            text = data.decode()
            with self._lock:
                if text in self._markers:
                    self._arrived.add(text)
                    continue
            self.messages.append((time.monotonic(), text))

    def wait_for(self, count: int, timeout: float = 5.0) -> list[tuple[float, str]]:
        wait_until(lambda: len(self.messages) >= count, timeout, lambda: f"{count} datagrams; got {self.messages}")
        return list(self.messages)

    def barrier(self, timeout: float = 5.0) -> None:
        """Return once every datagram sent to the socket before this call has been received.

        A datagram socket queues what it is sent in order, so a marker sent now arrives after them; the
        marker itself is not kept.
        """
        marker = f"BARRIER={uuid.uuid4().hex}"
        with self._lock:
            self._markers.add(marker)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(marker.encode(), self.sock.getsockname())
        wait_until(lambda: marker in self._arrived, timeout, f"the barrier datagram {marker}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()
