"""A stand-in for systemd's end of NOTIFY_SOCKET: a real AF_UNIX datagram socket read on a thread.

Each datagram is stamped by the kernel when it arrives (``SO_TIMESTAMPNS``, socket(7)), not by the
reading thread when it gets around to it: on a busy machine the thread can be kept off the CPU for a
second, and stamps taken then would bunch up and spread out what the sender did evenly. An AF_UNIX
datagram arrives inside the sender's ``sendto``, so the stamp is when it was sent.
"""

from __future__ import annotations

import socket
import struct
import threading
import uuid

from testing.waiting import wait_until

# Python has the constant from 3.14 on; 35 is Linux's SO_TIMESTAMPNS (SO_TIMESTAMPNS_OLD) in
# asm-generic/socket.h, used by x86 and ARM alike. Its control message carries the same number and a
# struct timespec of two C longs.
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@ll")  # tv_sec, tv_nsec


def _seconds(timespec: bytes) -> float:
    sec: int
    nsec: int
    sec, nsec = _TIMESPEC.unpack(timespec[:_TIMESPEC.size])
    return sec + nsec / 1e9


class NotifySocket:
    """Receives datagrams on a thread; ``messages`` holds each with the kernel's arrival time (wall clock,
    ``time.time()`` seconds)."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
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
                data, ancillary, _flags, _sender = self.sock.recvmsg(4096, socket.CMSG_SPACE(_TIMESPEC.size))
            except TimeoutError:
                continue
            [arrived] = [_seconds(cdata) for level, kind, cdata in ancillary
                         if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS)]
            text = data.decode()
            with self._lock:
                if text in self._markers:
                    self._arrived.add(text)
                    continue
            self.messages.append((arrived, text))

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
